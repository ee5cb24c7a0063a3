"""Small randomly initialised transformers models for trainer tests (fp32, CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "gateway" / "engine" / "tiny"


def tiny_model(arch: str, attn: str = "sdpa", seed: int = 0, vocab: int = 512) -> Any:
    """A 2-layer Qwen2 or Llama with GQA, random weights, fp32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common: dict[str, Any] = {
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 1024, "attn_implementation": attn}
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
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
