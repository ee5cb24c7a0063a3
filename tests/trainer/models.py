"""Small randomly initialised transformers models for trainer tests (fp32, CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "gateway" / "engine" / "tiny"

# Window smaller than the test sequences (40-100 tokens), so sliding layers really slide.
WINDOW = 16
# Gemma-2 caps attention scores at +-cap; 5 makes the cap bite on random weights.
SOFTCAP = 5.0


def tiny_model(arch: str, attn: str = "sdpa", seed: int = 0, vocab: int = 512) -> Any:
    """A 2-layer random fp32 model with GQA: qwen2, llama, mistral (sliding window on every
    layer) or gemma2 (attention soft-capping; layer 0 sliding, layer 1 full; eager only)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    common: dict[str, Any] = {
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 1024, "attn_implementation": attn}
    if arch == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**common))
    elif arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    elif arch == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(**common, sliding_window=WINDOW))
    elif arch == "gemma2":
        cfg = tf.Gemma2Config(**{**common, "attn_implementation": "eager"}, head_dim=16,
                              sliding_window=WINDOW, attn_logit_softcapping=SOFTCAP,
                              query_pre_attn_scalar=16,
                              layer_types=["sliding_attention", "full_attention"])
        model = tf.Gemma2ForCausalLM(cfg)
        # Random init gives scores of ~0.1, where tanh capping is the identity; larger q/k
        # weights push scores to ~+-10, so the cap at 5 changes the attention.
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(10)
                layer.self_attn.k_proj.weight.mul_(10)
    else:
        raise ValueError(arch)
    return model.float().eval()


def bundled_model() -> Any | None:
    """The gateway's bundled tiny model, or None while that folder does not exist."""
    if not (TINY / "config.json").is_file():
        return None
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
