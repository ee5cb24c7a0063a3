"""Build `arith64`: the bundled arith model, re-laid out with attention heads 64 wide.

    python scripts/build_arith64_model.py --out DIR

Why: vLLM's CPU attention refuses the bundled model's head_dim 16, and tiny64
(scripts/build_tiny64_model.py) has random weights, so `envhub train --engine vllm` on it has
nothing to learn from. This is the same function as the bundled model (Qwen2, fine-tuned on
arith by scripts/finetune_tiny_arith.py), written as a Llama with `head_dim` 64 that vLLM serves:

- each 16-wide head is zero-padded to 64: query/key dot products are unchanged, and so are the
  value sums once o_proj reads only the original 16 columns of each head;
- rotary embeddings pair dimension j with j + d/2 at frequency theta^(-2j/d): the original pair
  (i, i + 8) of d = 16 turns at theta^(-i/8), which is j = 4i of d = 64, so dims i and i + 8 go
  to 4i and 4i + 32;
- attention scales scores by 1/sqrt(d): 1/4 before, 1/8 now, so the query projection (weight
  and bias) is doubled, exact in bf16;
- Qwen2's q/k/v biases are a Llama with `attention_bias` (which also gives o_proj a bias: zero).

Byte-reproducible (the bundled weights in, tensors in name order out, config with sorted keys).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_tiny64_model import digest  # noqa: E402 - the same folder digest for both models

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "gateway" / "engine" / "tiny"
HEAD_DIM = 64
COPIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def slots(old: int, new: int) -> list[int]:
    """Where each of the `old` dims of a head goes in a `new`-wide head so that rotary
    frequencies match: dim i < old/2 -> i * r, dim old/2 + i -> new/2 + i * r (r = new/old)."""
    half, ratio = old // 2, new // old
    return [i * ratio for i in range(half)] + [new // 2 + i * ratio for i in range(half)]


def config(base: dict) -> dict:
    heads = base["num_attention_heads"]
    rope = base.get("rope_parameters") or {"rope_theta": base.get("rope_theta", 10000.0)}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": base["hidden_size"], "intermediate_size": base["intermediate_size"],
        "num_hidden_layers": base["num_hidden_layers"], "num_attention_heads": heads,
        "num_key_value_heads": base["num_key_value_heads"], "head_dim": HEAD_DIM,
        "vocab_size": base["vocab_size"], "max_position_embeddings":
            base["max_position_embeddings"], "rms_norm_eps": base["rms_norm_eps"],
        "hidden_act": base["hidden_act"], "tie_word_embeddings": base["tie_word_embeddings"],
        "attention_bias": True, "mlp_bias": False, "attention_dropout": 0.0,
        # both spellings: transformers 5 reads rope_parameters, vLLM's pinned 4.x rope_theta
        "rope_theta": rope["rope_theta"], "rope_parameters": {"rope_theta": rope["rope_theta"],
                                                              "rope_type": "default"},
        "bos_token_id": base["bos_token_id"], "eos_token_id": base["eos_token_id"],
        "torch_dtype": "bfloat16", "initializer_range": base.get("initializer_range", 0.02),
    }


def weights(tensors: dict, base: dict) -> dict:
    """The bundled tensors with every attention projection widened to HEAD_DIM per head."""
    import torch

    old = base["hidden_size"] // base["num_attention_heads"]
    where = torch.tensor(slots(old, HEAD_DIM))

    def widen_rows(t: torch.Tensor, heads: int, scale: float = 1.0) -> torch.Tensor:
        out = torch.zeros((heads, HEAD_DIM, *t.shape[1:]), dtype=t.dtype)
        out[:, where] = t.reshape(heads, old, *t.shape[1:]) * scale
        return out.reshape(heads * HEAD_DIM, *t.shape[1:])

    q_heads, kv_heads = base["num_attention_heads"], base["num_key_value_heads"]
    out = {}
    for name, t in tensors.items():
        if ".self_attn.q_proj." in name:
            out[name] = widen_rows(t, q_heads, scale=(HEAD_DIM / old) ** 0.5)
        elif ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            out[name] = widen_rows(t, kv_heads)
        elif name.endswith(".self_attn.o_proj.weight"):  # columns are (head, dim)
            out[name] = widen_rows(t.T.contiguous(), q_heads).T.contiguous()
            out[name.replace(".weight", ".bias")] = torch.zeros(t.shape[0], dtype=t.dtype)
        else:
            out[name] = t
    return out


def build(out: Path, base: Path = BUNDLED) -> str:
    """Write the model folder; returns the sha256 over its files (name + bytes, sorted)."""
    from safetensors.torch import load_file, save_file

    base_config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    if base_config.get("model_type") != "qwen2":
        raise SystemExit(f"{base}: expected the bundled Qwen2 model, got "
                         f"{base_config.get('model_type')!r}")
    out.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        shutil.copyfile(base / name, out / name)
    (out / "config.json").write_text(json.dumps(config(base_config), indent=2, sort_keys=True)
                                     + "\n", encoding="utf-8")
    tensors = weights(load_file(str(base / "model.safetensors")), base_config)
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return digest(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args()
    sha = build(args.out)
    size = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB, sha256 {sha})")


if __name__ == "__main__":
    main()
