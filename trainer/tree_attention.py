"""Tree attention for packed prefix trees, through transformers' AttentionInterface.

The model gets a [1, 1, 1, 1] placeholder as its 4D `attention_mask` (transformers passes a
4D mask through untouched) that carries the tree: each node's subtree end and depth. Every
attention layer then calls `tree_attention`, which reads the layer's own arguments — its
`sliding_window` (Gemma-2 alternates sliding and full layers) and `softcap` — and applies
them in tree terms: query i sees key j iff j is an ancestor-or-self of i
(j <= i < end[j]) and, with a window W, depth[i] - depth[j] < W — transformers' convention
`q - W < kv <= q` (masking_utils.sliding_window_overlay) on the unmerged sequence, whose
positions are the depths.

Three modes, chosen per forward by the placeholder (`TreeLayout.mode`):
- blocks: queries in blocks of `BLOCK` nodes attend only the keys some query of the block may
  see (ancestors of the block, inside the window), with SDPA, or eager scores when the layer
  soft-caps (SDPA has no score hook). Masked keys add exactly 0 to a softmax, so dropping them
  changes nothing but the cost: about what the unmerged sequences cost. One SDPA call per
  block and a host sync per block: right for a CPU, slow on a GPU.
- dense: the layer's [1, 1, N, N] additive mask goes to the model's own eager/SDPA function.
- flex: one FlexAttention kernel per layer on a BlockMask of the tree (flex_tree.py): the
  GPU path (on the CPU forward only: no backward there in torch 2.13).

Which one runs, and whether sequences are merged at all, is `choose_attention` and
`worth_merging` below (config `tree_attention`, default "auto"):
- an explicit mode is used as asked; flex with attention dropout in training is refused.
- auto on a non-CUDA device: blocks. Flex has no CPU backward and its eager forward took
  4.2 s against 26 ms for blocks on a 5728-node tree; dense ties blocks up to ~1500 nodes and
  loses beyond (1.5x at 4096 nodes, Qwen2 h256 x 4, 2 CPU threads).
- auto on CUDA: flex when torch has it, the head dim is >= 16 (the Triton kernel's minimum)
  and no attention dropout trains; else dense while the [N, N] mask is cheap (N <= 8192:
  128 MiB in bf16 per window kind), else blocks.
- merging (auto, CUDA only): a step's sequences are packed as one prefix tree only when the
  token bound (sequence tokens / tree nodes) is at least MERGE_MIN_BOUND = 1.1. Merged and
  unmerged
  run the same kernel on the same mask rule, and the merged tree does at most the unmerged
  work (every node is one of the unmerged tokens, every ancestor pair one of its causal
  pairs); what it can add is fixed overhead: a deeper, forked layout has more partially
  masked blocks (flex evaluates the mask there) and more SDPA calls (blocks). When merging
  saves under 10% of the tokens that overhead can eat the saving, so the plain packed batch
  (`pack(merge=False)`: packed variable-length sequences, no padding) runs instead. 1.1 is a
  guard chosen by that argument, not fitted; `bench_prefix_tree.py --workload shared` with a
  short `--shared` shows both sides of it on a given machine. On the CPU (blocks) the tree
  always merges: at bound 1.03 (8 x (4 + 128) tokens) it still ran 6% faster than the unmerged
  packed batch, at 1.11 5% faster.

Installed for good (`use_tree_attention`), not around one forward: gradient checkpointing
recomputes layers during backward and must find the same attention function (and the same
cached masks: the layout is built once per `tree_logprobs` call). Inputs without the
placeholder (generation, plain forwards) go to the model's previous implementation, so the
model behaves as before on them.
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
MODES = ("blocks", "dense", "flex")
MERGE_MIN_BOUND = 1.1  # on CUDA: sequence tokens / tree nodes below which "auto" unmerges
DENSE_MAX_NODES = 8192  # CUDA without flex: dense [N, N] masks up to here, blocks beyond


@dataclass
class TreeLayout:
    """The tree a placeholder mask stands for. N = nodes in pre-order."""

    end: torch.Tensor  # [N] int64: exclusive end of each node's subtree
    depth: torch.Tensor  # [N] int64: depth = position of each node
    mode: str  # "blocks", "dense" or "flex"
    # Masks built per (kind, window, dtype), shared by every layer of one forward.
    cache: dict[tuple[Any, ...], Any] = field(default_factory=dict)


def tree_mask(subtree_end: torch.Tensor, depth: torch.Tensor, dtype: torch.dtype,
              mode: str = "blocks") -> torch.Tensor:
    """The [1, 1, 1, 1] placeholder carrying the tree (no N^2 tensor is built here)."""
    if mode not in MODES:
        raise TrainerError(f"tree attention mode {mode!r}: use one of {', '.join(MODES)}")
    carrier = torch.zeros(1, 1, 1, 1, dtype=dtype, device=subtree_end.device)
    carrier._envhub_tree = TreeLayout(subtree_end, depth, mode)  # type: ignore[attr-defined]
    return carrier


def choose_attention(requested: str, device_type: str, head_dim: int, dropout: float,
                     n_nodes: int, flex: bool | None = None) -> str:
    """The mode that runs (module docstring): `requested` unless "auto". Pure logic: `flex`
    says whether FlexAttention imports (None: ask this torch)."""
    if requested != "auto":
        return requested
    if device_type != "cuda":
        return "blocks"
    if flex is None:
        from envhub.trainer.flex_tree import flex_available

        flex = flex_available()
    if flex and head_dim >= 16 and dropout == 0:
        return "flex"
    return "dense" if n_nodes <= DENSE_MAX_NODES else "blocks"


def worth_merging(n_sequence_tokens: int, n_nodes: int, device_type: str) -> bool:
    """Merge shared prefixes on CUDA only when the token bound is at least MERGE_MIN_BOUND;
    elsewhere always (the CPU tree was faster than the unmerged packed batch even at 1.03)."""
    if device_type != "cuda" or n_nodes == 0:
        return True
    return n_sequence_tokens / n_nodes >= MERGE_MIN_BOUND


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
                           "tree_attention='blocks' or attn_implementation='sdpa'")
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
    if t.mode == "dense":  # the model's own kernel with this layer's [1, 1, N, N] mask
        if base not in ("eager", "sdpa"):
            raise TrainerError(f"dense tree attention needs the model's eager or sdpa "
                               f"attention, not {base!r}: use tree_attention='blocks'")
        return base_attention(module, base)(  # type: ignore[no-any-return]
            module, query, key, value, dense_bias(t, query.dtype, window), scaling=scaling,
            dropout=dropout, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    p = dropout if getattr(module, "training", False) else 0.0
    if t.mode == "flex":
        from envhub.trainer.flex_tree import flex_tree_attention

        return flex_tree_attention(t, query, key, value, scale, p, window, softcap), None
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


def check_tree_forward(model: Any, mode: str = "auto") -> None:
    """Install tree attention and run a 2-node tree through `model` without gradients, so a
    layer passing an attention argument the tree cannot keep raises now, not mid-training
    ("auto" probes with blocks: the argument checks are the same for every mode)."""
    use_tree_attention(model)
    mode = "blocks" if mode == "auto" else mode
    param = next(model.parameters())
    end = torch.tensor([2, 2], device=param.device)  # node 1 is node 0's child
    depth = torch.tensor([0, 1], device=param.device)
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=param.device),
              position_ids=depth[None], attention_mask=tree_mask(end, depth, param.dtype, mode),
              use_cache=False, logits_to_keep=1)
