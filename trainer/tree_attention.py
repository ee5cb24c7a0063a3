"""Tree attention for packed prefix trees, through transformers' AttentionInterface.

The model gets a [1, 1, 1, 1] placeholder as its 4D `attention_mask` (transformers passes a
4D mask through untouched) that carries the tree: each node's subtree end and depth. Every
attention layer then calls `tree_attention`, which reads the layer's own arguments — its
`sliding_window` (Gemma-2 alternates sliding and full layers) and `softcap` — and applies
them in tree terms: query i sees key j iff j is an ancestor-or-self of i
(j <= i < end[j]) and, with a window W, depth[i] - depth[j] < W — transformers' convention
`q - W < kv <= q` (masking_utils.sliding_window_overlay) on the unmerged sequence, whose
positions are the depths.

Two modes, chosen per forward by the placeholder:
- sparse: queries in blocks of `BLOCK` nodes attend only the keys some query of the block may
  see (ancestors of the block, inside the window), with SDPA, or eager scores when the layer
  soft-caps (SDPA has no score hook). Masked keys add exactly 0 to a softmax, so dropping them
  changes nothing but the cost: about what the unmerged sequences cost.
- dense: the layer's [1, 1, N, N] additive mask goes to the model's own eager/SDPA function.

Installed for good (`use_tree_attention`), not around one forward: gradient checkpointing
recomputes layers during backward and must find the same attention function. Inputs without
the placeholder (generation, plain forwards) go to the model's previous implementation, so
the model behaves as before on them.

Not FlexAttention (`create_block_mask` + a softcap `score_mod`): in torch 2.13 on CPU it has
no backward ("FlexAttention does not support backward on CPU"), and for a 5728-node tree its
forward took 4.2 s eager, 49 ms compiled (after a 25 s compile) and 1.4-2 s per
`create_block_mask`, against 26 ms for the block-sparse forward here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from envhub.trainer.attention_features import check_kwargs
from envhub.trainer.errors import TrainerError

PREFIX = "envhub_tree"
BLOCK = 128


@dataclass
class TreeLayout:
    """The tree a placeholder mask stands for. N = nodes in pre-order."""

    end: torch.Tensor  # [N] int64: exclusive end of each node's subtree
    depth: torch.Tensor  # [N] int64: depth = position of each node
    sparse: bool
    # Masks built per (kind, window, dtype), shared by every layer of one forward.
    cache: dict[tuple[Any, ...], Any] = field(default_factory=dict)


def tree_mask(subtree_end: torch.Tensor, depth: torch.Tensor, dtype: torch.dtype,
              sparse: bool = True) -> torch.Tensor:
    """The [1, 1, 1, 1] placeholder carrying the tree (no N^2 tensor is built here)."""
    carrier = torch.zeros(1, 1, 1, 1, dtype=dtype, device=subtree_end.device)
    carrier._envhub_tree = TreeLayout(subtree_end, depth, sparse)  # type: ignore[attr-defined]
    return carrier


def _allowed(t: TreeLayout, rows: torch.Tensor, cols: torch.Tensor,
             window: int | None) -> torch.Tensor:
    """[R, C] bool: query node rows[r] may attend key node cols[c]."""
    r, c = rows[:, None], cols[None, :]
    ok = (c <= r) & (r < t.end[cols][None, :])
    if window is not None:
        ok &= (t.depth[rows][:, None] - t.depth[cols][None, :]) < window
    return ok


def _bias(ok: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [1, 1, R, C] mask: 0 where allowed, the dtype's minimum elsewhere."""
    bias = torch.zeros(ok.shape, dtype=dtype, device=ok.device)
    return bias.masked_fill_(~ok, torch.finfo(dtype).min)[None, None]


def dense_bias(t: TreeLayout, dtype: torch.dtype, window: int | None) -> torch.Tensor:
    """[1, 1, N, N] additive mask of one layer kind."""
    key = ("dense", window, dtype)
    if key not in t.cache:
        idx = torch.arange(t.end.shape[0], device=t.end.device)
        t.cache[key] = _bias(_allowed(t, idx, idx, window), dtype)
    return t.cache[key]  # type: ignore[no-any-return]


def blocks(t: TreeLayout, dtype: torch.dtype, window: int | None
           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per query block [s, s + BLOCK): (key nodes it may see [K], additive mask [1, 1, B, K])."""
    key = ("blocks", window, dtype)
    if key in t.cache:
        return t.cache[key]  # type: ignore[no-any-return]
    n = t.end.shape[0]
    idx = torch.arange(n, device=t.end.device)
    out = []
    for s in range(0, n, BLOCK):
        e = min(s + BLOCK, n)
        # Some query i of [s, e) has ancestor j iff j < e and end[j] > s (take i = max(j, s)).
        cols = (t.end[:e] > s).nonzero().flatten()
        ok = _allowed(t, idx[s:e], cols, window)
        if window is not None:  # keys outside every query's window
            keep = ok.any(0)
            cols, ok = cols[keep], ok[:, keep]
        out.append((cols, _bias(ok, dtype)))
    t.cache[key] = out
    return out


def _softcapped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                scaling: float, dropout: float, softcap: float) -> torch.Tensor:
    """Eager attention with soft-capped scores, as transformers' eager path (Gemma-2) does it:
    q [1, H, B, D], k/v [1, Hkv, K, D] -> [1, H, B, D]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # repeat_kv order
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    scores = softcap * torch.tanh(scores / softcap) + bias
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=dropout > 0)
    return torch.matmul(probs, v)


def _sparse(t: TreeLayout, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            scaling: float, dropout: float, window: int | None, softcap: float | None
            ) -> torch.Tensor:
    """query [1, H, N, D], key/value [1, Hkv, N, D] -> [1, N, H, D]."""
    import torch.nn.functional as F

    gqa = query.shape[1] != key.shape[1]
    outs = []
    for b, (cols, bias) in enumerate(blocks(t, query.dtype, window)):
        q = query[:, :, b * BLOCK:(b + 1) * BLOCK]
        k, v = key[:, :, cols], value[:, :, cols]
        if softcap is None:
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout,
                                                       scale=scaling, enable_gqa=gqa))
        else:
            outs.append(_softcapped(q, k, v, bias, scaling, dropout, softcap))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def base_attention(module: Any, base: str) -> Any:
    """The function the layer would call under implementation `base` (its own eager)."""
    from transformers import AttentionInterface

    if base != "eager":
        return AttentionInterface()[base]
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise TrainerError(f"{type(module).__name__} has no eager_attention_forward; use "
                           "sparse_attention=True or attn_implementation='sdpa'")
    return eager


def tree_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                   *, base: str = "sdpa", **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """AttentionInterface function: tree attention on a placeholder mask, `base` otherwise."""
    t = getattr(attention_mask, "_envhub_tree", None)
    if t is None:  # a plain forward: exactly what the model did before
        return base_attention(module, base)(module, query, key, value,  # type: ignore[no-any-return]
                                            attention_mask, scaling=scaling, dropout=dropout,
                                            **kwargs)
    window, softcap = check_kwargs(module, kwargs)
    if query.shape[0] != 1:
        raise ValueError("tree attention needs one packed row (batch size 1)")
    if not t.sparse:  # dense: the model's own kernel with this layer's [1, 1, N, N] mask
        if base not in ("eager", "sdpa"):
            raise TrainerError(f"dense tree attention needs the model's eager or sdpa "
                               f"attention, not {base!r}: use sparse_attention=True")
        return base_attention(module, base)(  # type: ignore[no-any-return]
            module, query, key, value, dense_bias(t, query.dtype, window), scaling=scaling,
            dropout=dropout, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    p = dropout if getattr(module, "training", False) else 0.0
    return _sparse(t, query, key, value, scale, p, window, softcap), None


def use_tree_attention(model: Any) -> None:
    """Route `model`'s attention through `tree_attention` from now on (idempotent).

    Refuses (`UnsupportedAttention`) a model whose attention the tree cannot keep exact.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    from envhub.trainer.attention_features import check_model

    cfg = model.config
    base = cfg._attn_implementation or "eager"
    if base.startswith(PREFIX):
        return
    check_model(model)
    name = f"{PREFIX}/{base}"
    AttentionInterface.register(name, partial(tree_attention, base=base))
    if base in ALL_MASK_ATTENTION_FUNCTIONS:  # plain forwards build the masks `base` builds
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    cfg._attn_implementation = name


def restore_attention(model: Any) -> None:
    """Undo `use_tree_attention`: back to the implementation the model had before."""
    name = model.config._attn_implementation or ""
    if name.startswith(PREFIX + "/"):
        model.config._attn_implementation = name[len(PREFIX) + 1:]


def check_tree_forward(model: Any, sparse: bool = True) -> None:
    """Install tree attention and run a 2-node tree through `model` without gradients, so a
    layer passing an attention argument the tree cannot keep raises now, not mid-training."""
    use_tree_attention(model)
    param = next(model.parameters())
    end = torch.tensor([2, 2], device=param.device)  # node 1 is node 0's child
    depth = torch.tensor([0, 1], device=param.device)
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=param.device),
              position_ids=depth[None], attention_mask=tree_mask(end, depth, param.dtype, sparse),
              use_cache=False, logits_to_keep=1)
