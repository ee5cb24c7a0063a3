"""Build `tiny64`: a seeded random Qwen3 causal LM with head_dim 64 and the bundled tokenizer.

    python scripts/build_tiny64_model.py --out DIR [--seed 0]

Why a second tiny model: vLLM's CPU attention serves head_dim 32, 64, 80, ... 512, and the bundled
model (gateway/engine/tiny, fine-tuned for the arith environment) has head_dim 16. This one
exists to run a real vLLM behind the gateway in tests: token-exactness and weight updates need
a real tokenizer, not trained weights. Qwen3 takes `head_dim` apart from `hidden_size`, so the
150k-row embedding stays narrow (hidden 16: ~5 MB in bf16) while attention heads are 64 wide.

Byte-reproducible: weights come from a seeded torch.Generator, the config is written with
sorted keys, the tokenizer files are copied from the bundled model, and safetensors writes
tensors in name order. The same seed gives the same bytes (tests/gateway/test_tiny64_model.py);
another seed gives other weights with the same shapes (a weight update for tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "gateway" / "engine" / "tiny"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
VOCAB = 151665  # the bundled tokenizer's size: every sampled id decodes
ENDOFTEXT_ID, IM_END_ID = 151643, 151645

# hidden 16, 2 query heads and 1 key/value head of width 64, 2 layers
SHAPE = {"hidden_size": 16, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}


def config() -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **SHAPE,
        "vocab_size": VOCAB, "max_position_embeddings": 4096, "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": True, "use_sliding_window": False,
        "bos_token_id": ENDOFTEXT_ID, "eos_token_id": IM_END_ID, "torch_dtype": "bfloat16",
        "initializer_range": 0.3,
    }


def generation_config() -> dict:
    return {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
            "pad_token_id": ENDOFTEXT_ID, "do_sample": True, "temperature": 1.0, "top_p": 1.0}


def weights(seed: int) -> dict:
    """Name -> bf16 tensor. Wide inits (embedding std 1, linear std 0.3) give peaked but varied
    next-token distributions from random weights, as scripts/build_tiny_model.py explains."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, ffn, d = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["head_dim"]
    q, kv = SHAPE["num_attention_heads"] * d, SHAPE["num_key_value_heads"] * d

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float32).mul_(std).bfloat16()

    out = {"model.embed_tokens.weight": normal(VOCAB, h, std=1.0),
           "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(SHAPE["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "self_attn.q_norm.weight": torch.ones(d, dtype=torch.bfloat16),
            p + "self_attn.k_norm.weight": torch.ones(d, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": normal(q, h, std=0.3),
            p + "self_attn.k_proj.weight": normal(kv, h, std=0.3),
            p + "self_attn.v_proj.weight": normal(kv, h, std=0.3),
            p + "self_attn.o_proj.weight": normal(h, q, std=0.3),
            p + "mlp.gate_proj.weight": normal(ffn, h, std=0.3),
            p + "mlp.up_proj.weight": normal(ffn, h, std=0.3),
            p + "mlp.down_proj.weight": normal(h, ffn, std=0.3),
        }
    return out


def build(out: Path, seed: int = 0) -> str:
    """Write the model folder; returns the sha256 over its files (name + bytes, sorted)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(BUNDLED / name, out / name)
    for name, body in (("config.json", config()), ("generation_config.json",
                                                  generation_config())):
        (out / name).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n",
                                encoding="utf-8")
    save_file(weights(seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return digest(out)


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="weight init seed")
    args = parser.parse_args()
    sha = build(args.out, args.seed)
    size = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB, sha256 {sha})")


if __name__ == "__main__":
    main()
