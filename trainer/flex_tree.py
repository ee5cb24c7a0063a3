"""Tree attention through FlexAttention (torch.nn.attention.flex_attention): the GPU path.

The tree's mask is a FlexAttention `BlockMask` built once per forward from the layout's
(end, depth) and cached in it per window, so every layer and the recompute of gradient
checkpointing reuse it:

    mask_mod(q, kv) = (kv <= q) & (q < end[kv])            ancestor-or-self (pre-order)
                      & (depth[q] - depth[kv] < window)     sliding layers only

Blocks of 128x128 (query, key) nodes that no pair of the tree allows are skipped by the
kernel, full ones run without the mask, and only the partial ones evaluate `mask_mod`: one
fused kernel per layer, no host synchronisation, no N x N tensor (`_compile=True` builds the
BlockMask blockwise on CUDA). Soft-capping (Gemma-2) is a `score_mod`,
`softcap * tanh(score / softcap)`, applied to the already scaled score as transformers' eager
path does; GQA is `enable_gqa=True`.

On CUDA flex_attention runs compiled (`torch.compile`, once per process; new trees reuse the
kernel because the mask closures share their code and the captured tensors only change size,
which dynamo's automatic dynamic shapes absorb). On the CPU it runs eagerly and has no
backward in torch 2.13 ("FlexAttention does not support backward on CPU"): the CPU keeps the
block-sparse path (tree_attention.py), and flex there is for checking the mask and the
forward. FlexAttention has no dropout: attention dropout in training is refused.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from envhub.trainer.errors import TrainerError

if TYPE_CHECKING:
    import torch

    from envhub.trainer.tree_attention import TreeLayout

FLEX_BLOCK = 128  # FlexAttention's default (query, key) block


def flex_available() -> bool:
    """This torch has FlexAttention."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def tree_mask_mod(end: torch.Tensor, depth: torch.Tensor, window: int | None) -> Any:
    """The tree as a FlexAttention mask_mod over node indices (end, depth: [N] int64)."""
    if window is None:
        def ancestors(b: Any, h: Any, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            return (kv <= q) & (q < end[kv])
        return ancestors

    def ancestors_in_window(b: Any, h: Any, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (kv <= q) & (q < end[kv]) & (depth[q] - depth[kv] < window)
    return ancestors_in_window


def block_mask(t: TreeLayout, window: int | None) -> Any:
    """The layout's BlockMask for one window value, built on first use and cached."""
    key = ("flex", window)
    if key not in t.cache:
        from torch.nn.attention.flex_attention import create_block_mask

        n = int(t.end.shape[0])
        t.cache[key] = create_block_mask(
            tree_mask_mod(t.end, t.depth, window), B=None, H=None, Q_LEN=n, KV_LEN=n,
            device=t.end.device, BLOCK_SIZE=FLEX_BLOCK, _compile=t.end.device.type == "cuda")
    return t.cache[key]


@cache
def softcap_mod(softcap: float) -> Any:
    """score_mod capping scores at +-softcap; one function object per value (no recompiles)."""
    import torch

    def capped(score: torch.Tensor, b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
        return softcap * torch.tanh(score / softcap)
    return capped


@cache
def _kernel(device_type: str) -> Any:
    """flex_attention, compiled where it has a fused kernel (CUDA), eager elsewhere."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention


def flex_tree_attention(t: TreeLayout, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, scaling: float, dropout: float,
                        window: int | None, softcap: float | None) -> torch.Tensor:
    """query [1, H, N, D], key/value [1, Hkv, N, D] -> [1, N, H, D]."""
    import torch

    if dropout > 0:
        raise TrainerError(
            f"FlexAttention has no attention dropout (this layer trains with p={dropout}): "
            "set tree_attention='blocks' (exact with dropout) or the model's "
            "attention_dropout to 0")
    if query.device.type != "cuda" and query.requires_grad:
        raise TrainerError(
            f"FlexAttention has no backward on {query.device.type} (torch "
            f"{torch.__version__}): train there with tree_attention='blocks' or 'auto'; flex on "
            "that device is for forwards without gradients")
    out = _kernel(query.device.type)(
        query, key, value, score_mod=None if softcap is None else softcap_mod(softcap),
        block_mask=block_mask(t, window), scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous()  # type: ignore[union-attr]
