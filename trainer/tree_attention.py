"""Block-sparse attention for packed prefix trees.

A dense [N, N] mask makes tree attention cost N^2 although each node only attends its
ancestors. Here queries are taken in blocks of `BLOCK` nodes; each block attends only the
keys that at least one of its queries may see (ancestors of the block, found from the mask),
with the mask restricted to those keys. Masked keys contributed exactly 0 to the dense
softmax, so dropping them changes nothing but the cost, which becomes the sum over blocks of
block x (ancestors of the block) — about what the unmerged sequences cost.

It plugs into transformers' AttentionInterface under the name "envhub_tree" and is switched
on only for the duration of one tree forward (`sparse_tree_attention(model)`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

NAME = "envhub_tree"
BLOCK = 128


def tree_mask(subtree_end: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A [1, 1, 1, 1] placeholder that carries the tree instead of a dense [N, N] mask.

    transformers passes a 4D `attention_mask` through untouched, so the placeholder reaches
    `tree_attention`, which builds only the per-block masks it needs (no N^2 tensor at all).
    """
    carrier = torch.zeros(1, 1, 1, 1, dtype=dtype, device=subtree_end.device)
    carrier._envhub_tree_end = subtree_end  # type: ignore[attr-defined]
    return carrier


def _blocks(mask: torch.Tensor, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per query block: (key indices it may see, its additive [1, 1, B, K] mask); cached on
    the mask object, which every layer of one forward shares."""
    cached = getattr(mask, "_envhub_blocks", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    end = getattr(mask, "_envhub_tree_end", None)
    out = []
    if end is None:  # a dense additive mask: 0 exactly where allowed
        allowed = mask[0, 0] == 0
        for s in range(0, allowed.shape[0], BLOCK):
            cols = allowed[s:s + BLOCK].any(0).nonzero().flatten()
            out.append((cols, mask[:, :, s:s + BLOCK][..., cols]))
    else:
        # j may be seen by some query i of [s, e) iff j <= i < end[j] for some i, which
        # holds iff j < e and end[j] > s (take i = max(j, s)).
        n = end.shape[0]
        idx = torch.arange(n, device=end.device)
        for s in range(0, n, BLOCK):
            e = min(s + BLOCK, n)
            cols = (end[:e] > s).nonzero().flatten()
            rows = idx[s:e, None]
            ok = (cols[None, :] <= rows) & (rows < end[cols][None, :])
            bias = torch.zeros(ok.shape, dtype=dtype, device=end.device)
            bias.masked_fill_(~ok, torch.finfo(dtype).min)
            out.append((cols, bias[None, None]))
    mask._envhub_blocks = out  # type: ignore[attr-defined]
    return out


def tree_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None,
                   dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [1, H, N, D], key/value [1, Hkv, N, D], mask [1, 1, N, N] -> [1, N, H, D]."""
    import torch.nn.functional as F

    if attention_mask is None or attention_mask.ndim != 4 or query.shape[0] != 1:
        raise ValueError("envhub_tree attention needs one packed row and its 4D tree mask")
    p = dropout if module.training else 0.0
    gqa = query.shape[1] != key.shape[1]
    outs = []
    for b, (cols, m) in enumerate(_blocks(attention_mask, query.dtype)):
        s = b * BLOCK
        q = query[:, :, s:s + BLOCK]
        k, v = key[:, :, cols], value[:, :, cols]
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=p,
                                                   scale=scaling, enable_gqa=gqa))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, tree_attention)


def supports(model: Any) -> bool:
    """Models whose attention goes through transformers' AttentionInterface."""
    cfg = getattr(model, "config", None)
    check = getattr(model, "_can_set_attn_implementation", None)
    return cfg is not None and hasattr(cfg, "_attn_implementation") and bool(
        check() if callable(check) else False)


@contextmanager
def sparse_tree_attention(model: Any) -> Iterator[None]:
    """Route the model's attention through `tree_attention` inside the block."""
    _register()
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = NAME
    try:
        yield
    finally:
        cfg._attn_implementation = before
