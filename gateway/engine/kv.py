"""KV-cache surgery for continuous batching: merge new rows in, drop finished rows, trim padding.

A batch is left-padded: row r's real tokens end at the last column, its padding (attention
mask 0) sits on the left. Every cache tensor is [B, kv_heads, T, head_dim]; the mask is [B, T].
We only touch full-attention dynamic caches; both the layer API of transformers >= 4.56
(`cache.layers[i].keys`) and the older list API (`cache.key_cache[i]`) are handled.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache

Layers = list[tuple[torch.Tensor, torch.Tensor]]


def cache_name(model: Any) -> str:
    """What `model` calls its KV cache, as forward's argument and as the output's field: newer
    transformers renamed `past_key_values` to `cache` (the old name warns on every model call
    there); 5.17 knows only `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def read_layers(cache: Any) -> Layers:
    """(keys, values) per layer, each [B, H, T, D]."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def build_cache(layers: Layers) -> DynamicCache:
    cache = DynamicCache()
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


def _pad_left(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def merge(a: Any, mask_a: torch.Tensor, b: Any, mask_b: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Stack batch b under batch a, left-padding the shorter one to the longer length."""
    length = max(mask_a.shape[1], mask_b.shape[1])
    layers = [
        (torch.cat([_pad_left(ka, length, 2), _pad_left(kb, length, 2)]),
         torch.cat([_pad_left(va, length, 2), _pad_left(vb, length, 2)]))
        for (ka, va), (kb, vb) in zip(read_layers(a), read_layers(b), strict=True)
    ]
    mask = torch.cat([_pad_left(mask_a, length, 1), _pad_left(mask_b, length, 1)])
    return build_cache(layers), mask


def select(cache: Any, mask: torch.Tensor, keep: list[int]) -> tuple[Any, torch.Tensor]:
    """Keep rows `keep` (in that order) and cut the padding columns no kept row needs."""
    index = torch.tensor(keep, dtype=torch.long, device=mask.device)
    mask = mask.index_select(0, index)
    # Leading columns that are padding in every kept row are dead weight for each later step.
    used = mask.any(dim=0).nonzero()
    start = int(used[0]) if len(used) else mask.shape[1]
    layers = [(k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
              for k, v in read_layers(cache)]
    return build_cache(layers), mask[:, start:]


def drop_dead(cache: Any, mask: torch.Tensor, start: int) -> tuple[Any, torch.Tensor]:
    """Drop the columns from `start` on that no row attends to (mask 0 in every row: the
    rejected and dummy slots of a speculative step)."""
    live = mask[:, start:].any(dim=0)  # [T - start]
    if bool(live.all()):
        return cache, mask
    cols = torch.cat([torch.arange(start, device=mask.device),
                      start + live.nonzero().flatten()])
    layers = [(k.index_select(2, cols), v.index_select(2, cols)) for k, v in read_layers(cache)]
    return build_cache(layers), mask.index_select(1, cols)


def compact(cache: Any, mask: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Move each row's live columns (mask 1), in order, to the right end of a cache as wide
    as the longest row: the holes speculative steps leave (rejected drafts, other rows'
    accepted ones) are gone. Positions are explicit, so only the layout changes."""
    counts = mask.sum(dim=1)  # [B]
    width = int(counts.max())
    order = torch.argsort(mask.to(torch.int8), dim=1, stable=True)  # holes first, then live
    index = order[:, -width:] if width else order[:, :0]  # [B, width], live columns in order
    new_mask = (torch.arange(width, device=mask.device)[None, :]
                >= (width - counts)[:, None]).to(mask.dtype)

    def take(t: torch.Tensor) -> torch.Tensor:  # [B, H, T, D] -> [B, H, width, D]
        i = index[:, None, :, None].expand(t.shape[0], t.shape[1], width, t.shape[3])
        return torch.gather(t, 2, i.to(t.device))

    return build_cache([(take(k), take(v)) for k, v in read_layers(cache)]), new_mask
