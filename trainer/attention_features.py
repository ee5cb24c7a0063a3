"""Which per-model attention features the tree attention keeps exact, and loud refusals for
the rest.

Kept: causal attention, GQA, `scaling`, dropout, sliding windows (`sliding_window`, per
layer, applied in tree distance) and score soft-capping (`softcap`, Gemma-2). Anything else
that changes which keys a query sees or how it scores them cannot be read off the prefix
tree the same way, so a model that needs it is refused with a `TrainerError` naming the
model type and the feature — from its config before training (`check_model`), and from the
arguments its layers pass to the attention function (`check_kwargs`, also hit by the probe
forward `Trainer` runs at construction).
"""

from __future__ import annotations

from typing import Any

from envhub.trainer.errors import TrainerError

# Arguments layers pass that the tree attention uses or may ignore: positions are already in
# the rotary embedding, the cache is off in training.
USED = {"sliding_window", "softcap"}
IGNORED = {"position_ids", "cache_position", "use_cache", "past_key_values", "cache"}

# Attention arguments that carry a feature the tree path does not implement, with its name.
REFUSED_KWARGS = {
    "s_aux": "attention sinks (s_aux)",
    "sinks": "attention sinks",
    "position_bias": "a relative position bias",
    "is_causal": "bidirectional (non-causal) attention",
    "output_attentions": "returning attention weights",
    "cu_seq_lens_q": "varlen packing (cu_seq_lens)",
    "cu_seq_lens_k": "varlen packing (cu_seq_lens)",
}

# Layer kinds whose masks come from `sliding_window` / full causality; any other layer type
# (chunked, linear/recurrent, bidirectional) has no tree equivalent here.
KEPT_LAYER_TYPES = {"full_attention", "sliding_attention"}


class UnsupportedAttention(TrainerError):
    """The model's attention has a feature the tree attention cannot keep exact."""

    def __init__(self, model_type: str, feature: str, where: str) -> None:
        super().__init__(
            f"{model_type}: {feature} ({where}) is not kept by envhub's tree attention, so the "
            "packed forward would not equal the model's own. Train this model with another "
            "trainer, or turn the feature off in its config if the checkpoint allows it.")
        self.model_type = model_type
        self.feature = feature


def _model_type(cfg: Any) -> str:
    return str(getattr(cfg, "model_type", None) or type(cfg).__name__)


def supports_interface(model: Any) -> bool:
    """The model routes attention through transformers' AttentionInterface."""
    cfg = getattr(model, "config", None)
    check = getattr(model, "_can_set_attn_implementation", None)
    return cfg is not None and hasattr(cfg, "_attn_implementation") and bool(
        check() if callable(check) else False)


def text_config(model: Any) -> Any:
    """The config of `model`'s language model (a multimodal config's text part)."""
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def check_model(model: Any) -> None:
    """Raise `UnsupportedAttention` for a model whose config shows a refused feature."""
    cfg = model.config
    kind = _model_type(cfg)
    if not supports_interface(model):
        raise UnsupportedAttention(kind, "attention outside transformers' AttentionInterface",
                                   "the tree mask cannot be routed to it")
    for feature, where in _config_features(text_config(model)):
        raise UnsupportedAttention(kind, feature, where)
    for name, _ in model.named_parameters():
        if name.rsplit(".", 1)[-1] == "sinks":
            raise UnsupportedAttention(kind, "attention sinks", f"parameter {name}")


def _config_features(cfg: Any) -> list[tuple[str, str]]:
    """(feature, config attribute) for every refused feature the config switches on."""
    found = []
    if getattr(cfg, "attention_chunk_size", None):
        found.append(("chunked attention", "config.attention_chunk_size"))
    if getattr(cfg, "alibi", False) or getattr(getattr(cfg, "attn_config", None), "alibi", False):
        found.append(("ALiBi position biases", "config.alibi"))
    if _model_type(cfg) == "bloom":
        found.append(("ALiBi position biases", "model_type bloom"))
    if getattr(cfg, "relative_attention_num_buckets", None):
        found.append(("a relative position bias", "config.relative_attention_num_buckets"))
    if getattr(cfg, "use_bidirectional_attention", False):
        found.append(("bidirectional attention", "config.use_bidirectional_attention"))
    for kind in sorted(set(getattr(cfg, "layer_types", None) or []) - KEPT_LAYER_TYPES):
        found.append((f"layers of type {kind!r}", "config.layer_types"))
    return found


def check_kwargs(module: Any, kwargs: dict[str, Any]) -> tuple[int | None, float | None]:
    """(sliding_window, softcap) of this layer's call; refuse any other live feature."""
    for name, value in kwargs.items():
        if value is None or name in USED or name in IGNORED:
            continue
        if name == "is_causal" and value is True or name == "output_attentions" and not value:
            continue
        feature = REFUSED_KWARGS.get(name, f"the attention argument {name!r}")
        kind = _model_type(getattr(module, "config", None) or module)
        raise UnsupportedAttention(kind, feature, f"passed by {type(module).__name__}")
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    return (int(window) if window is not None else None,
            float(softcap) if softcap is not None else None)
