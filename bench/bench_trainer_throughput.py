"""Trainer throughput on CPU (issue 7): full `Trainer.step` — filters, advantages, packed
forward/backward, AdamW — on the bundled model (or a same-size random Qwen2 if absent).

Reports tokens/s counted two ways: sequence tokens (what an unmerged batch would process)
and packed tokens (what the model actually ran), with and without prefix merging.

    .venv/bin/python bench/bench_trainer_throughput.py [--groups 4] [--steps 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from envhub.trainer.config import TrainerConfig
from envhub.trainer.source import Group
from envhub.trainer.synthetic import RolloutShape, sample_group
from envhub.trainer.trainer import Trainer

TINY = Path(__file__).resolve().parents[1] / "gateway" / "engine" / "tiny"


def load_model():
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if (TINY / "config.json").is_file():
        return "bundled tiny model", AutoModelForCausalLM.from_pretrained(TINY,
                                                                         dtype=torch.float32)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=151665, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=True)
    return "random Qwen2 (bundled-model size)", Qwen2ForCausalLM(cfg).float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(2)
    name, model = load_model()
    shape = RolloutShape(sessions=8, turns=10, prompt_len=128, completion_len=(16, 48),
                         tool_len=(16, 48), cm_every=5, keep_prompt=96, summary_len=32)
    t0 = time.perf_counter()
    groups = [Group(f"g{i}", sample_group(model, f"g{i}", shape, seed=i))
              for i in range(args.groups)]
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params; sampled "
          f"{args.groups} groups x 8 sessions x 10 turns in {time.perf_counter() - t0:.1f}s")
    print(f"{'packing':<10} {'seq tok':>8} {'packed':>8} {'step s':>8} {'seq tok/s':>10} "
          f"{'packed tok/s':>12}")
    for merge in (True, False):
        trainer = Trainer(model, TrainerConfig.model_validate(
            {"prefix_merge": merge, "max_tokens_per_forward": 8192, "optim": {"lr": 1e-6}}))
        trainer.step(groups[:1])  # warm-up
        best, metrics = float("inf"), {}
        for _ in range(args.steps):
            t = time.perf_counter()
            metrics = trainer.step(groups)
            best = min(best, time.perf_counter() - t)
        seq, packed = metrics["tokens/naive"], metrics["tokens/packed"]
        print(f"{'tree' if merge else 'unmerged':<10} {seq:>8.0f} {packed:>8.0f} {best:>8.2f} "
              f"{seq / best:>10.0f} {packed / best:>12.0f}")


if __name__ == "__main__":
    main()
