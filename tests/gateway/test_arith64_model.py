"""scripts/build_arith64_model.py: the bundled arith model with 64-wide heads computes the same
function (real transformers forward passes of both on a rendered arith prompt)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.gateway.config import BUNDLED_MODEL

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_arith64_model.py"


def build(out: Path) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], check=True,
                          capture_output=True, text=True)
    return done.stdout.rsplit("sha256 ", 1)[1].strip(" )\n")


@pytest.mark.slow  # two model loads and builds: ~60 s on the shared 2-core machine
def test_same_logits_as_the_bundled_model_with_head_dim_64(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from tests.support import bundled_renderer

    assert build(tmp_path / "a") == build(tmp_path / "b")  # byte-reproducible
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["head_dim"] == 64 and config["architectures"] == ["LlamaForCausalLM"]
    ids = bundled_renderer().render_prompt(
        [{"role": "user", "content": "What is 17 * 23 + 4? Use the calculator."}], tools=None).ids
    x = torch.tensor([ids])
    logits = []
    for folder in (BUNDLED_MODEL, tmp_path / "a"):
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        with torch.no_grad():
            logits.append(model(x).logits[0])
    before, after = logits
    # same weights, re-laid out: only float summation order differs
    assert torch.allclose(before, after, atol=1e-4, rtol=1e-4), \
        float((before - after).abs().max())
    assert torch.equal(before.argmax(-1), after.argmax(-1))
