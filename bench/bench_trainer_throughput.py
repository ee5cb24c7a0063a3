"""Trainer throughput and memory on CPU (issue 7): full `Trainer.step` — filters, advantages,
packed forward/backward, AdamW — on the bundled model (or a same-size random Qwen2 if absent),
one row per configuration, side by side.

Each row runs in its own subprocess, so its peak memory is its own: `peak MB` is the child's
max RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`) at the end, `step MB` how far the steps
pushed it above the max RSS after loading the model and the groups (the activations,
gradients and optimizer state of the step). tokens/s counts sequence tokens (what an unmerged
batch processes) and packed tokens (what the model actually ran); `bound` is their ratio (the
token bound) and `ran` the tree-attention mode the step ran and whether it merged (the
trainer's step metrics attention/<mode> and tree/merged). `precision` bf16 is
bfloat16 autocast with fp32 master weights (TrainerConfig.precision); on a CUDA machine the
Trainer places the model on the GPU and `gpu MB` is torch's peak allocated GPU memory.

    .venv/bin/python bench/bench_trainer_throughput.py [--groups 4] [--steps 2] [--turns 10]
                                                       [--model bundled|wide] [--only tree]

Add a configuration by adding a `Row` to ROWS (TrainerConfig overrides, parameter dtype).
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from envhub.trainer.config import TrainerConfig
from envhub.trainer.source import Group
from envhub.trainer.synthetic import RolloutShape, sample_group
from envhub.trainer.trainer import Trainer

TINY = Path(__file__).resolve().parents[1] / "gateway" / "engine" / "tiny"


@dataclass
class Row:
    """One configuration: a label, TrainerConfig overrides and the parameters' dtype."""

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    cuda_only: bool = False  # FlexAttention has no backward on the CPU


# "tree" rows pin a tree-attention mode; "auto" is the default config (the selector picks the
# mode and whether to merge); "unmerged packed" is the fair baseline: every sequence its own
# chain in one packed row (no padding), through the same attention.
BLOCKS = {"prefix_merge": True, "tree_attention": "blocks"}
UNMERGED = {"prefix_merge": False, "tree_attention": "blocks"}
ROWS = [
    Row("auto", {}),
    Row("tree", BLOCKS),
    Row("tree + ckpt", {**BLOCKS, "gradient_checkpointing": True}),
    Row("unmerged packed", UNMERGED),
    Row("unmerged + ckpt", {**UNMERGED, "gradient_checkpointing": True}),
    Row("tree, dense mask", {"prefix_merge": True, "tree_attention": "dense"}),
    Row("tree, flex", {"prefix_merge": True, "tree_attention": "flex"}, cuda_only=True),
    Row("unmerged, flex", {"prefix_merge": False, "tree_attention": "flex"}, cuda_only=True),
    # bf16 autocast (fp32 master weights) beside the fp32 rows above
    Row("auto", {"precision": "bf16"}),
    Row("tree", {**BLOCKS, "precision": "bf16"}),
    Row("tree + ckpt", {**BLOCKS, "gradient_checkpointing": True, "precision": "bf16"}),
    Row("unmerged packed", {**UNMERGED, "precision": "bf16"}),
    Row("unmerged + ckpt", {**UNMERGED, "gradient_checkpointing": True, "precision": "bf16"}),
    Row("tree, flex", {"prefix_merge": True, "tree_attention": "flex", "precision": "bf16"},
        cuda_only=True),
    Row("unmerged, flex", {"prefix_merge": False, "tree_attention": "flex",
                           "precision": "bf16"}, cuda_only=True),
]


def load_model(kind: str = "bundled") -> tuple[str, Any]:
    """bundled: the gateway's tiny model (hidden 64, 2 layers, 151k vocabulary: the LM head
    dominates); wide: a random Qwen2 whose decoder layers dominate (what checkpointing
    trades)."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if kind == "wide":
        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=8192, hidden_size=256, intermediate_size=768,
                          num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4)
        return "random wide Qwen2", Qwen2ForCausalLM(cfg).float()
    if (TINY / "config.json").is_file():
        return "bundled tiny model", AutoModelForCausalLM.from_pretrained(TINY,
                                                                         dtype=torch.float32)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=151665, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=True)
    return "random Qwen2 (bundled-model size)", Qwen2ForCausalLM(cfg).float()


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_row(row: Row, kind: str, groups_file: str, steps: int) -> dict[str, float]:
    """In the child: `steps` timed steps after a warm-up one; best step time and memory."""
    _, model = load_model(kind)
    model = model.to(getattr(torch, row.dtype))
    with open(groups_file, "rb") as f:
        groups: list[Group] = pickle.load(f)
    base_mb = max_rss_mb()
    cfg = {"max_tokens_per_forward": 8192, "optim": {"lr": 1e-6}, **row.config}
    trainer = Trainer(model, TrainerConfig.model_validate(cfg))
    trainer.step(groups[:1])  # warm-up (allocator, optimizer state)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    best, metrics = float("inf"), {}
    for _ in range(steps):
        t = time.perf_counter()
        metrics = trainer.step(groups)
        best = min(best, time.perf_counter() - t)
    peak = max_rss_mb()
    gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0
    modes = [k.split("/")[1] for k, v in metrics.items() if k.startswith("attention/") and v]
    ran = "+".join(modes) + ("" if metrics["tree/merged"] else ", unmerged")
    return {"seq": metrics["tokens/naive"], "packed": metrics["tokens/packed"], "step_s": best,
            "peak_mb": peak, "step_mb": peak - base_mb, "gpu_mb": gpu, "ran": ran}


def sample_groups(model: Any, n: int, turns: int) -> list[Group]:
    shape = RolloutShape(sessions=8, turns=turns, prompt_len=128, completion_len=(16, 48),
                         tool_len=(16, 48), cm_every=5, keep_prompt=96, summary_len=32)
    return [Group(f"g{i}", sample_group(model, f"g{i}", shape, seed=i)) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--model", choices=["bundled", "wide"], default="bundled")
    ap.add_argument("--only", help="run only the rows whose name contains this")
    ap.add_argument("--row", help=argparse.SUPPRESS)  # child mode: a Row as JSON
    ap.add_argument("--groups-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.row:
        print(json.dumps(run_row(Row(**json.loads(args.row)), args.model, args.groups_file,
                                 args.steps)))
        return
    name, model = load_model(args.model)
    t0 = time.perf_counter()
    groups = sample_groups(model, args.groups, args.turns)
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params; sampled "
          f"{args.groups} groups x 8 sessions x {args.turns} turns in "
          f"{time.perf_counter() - t0:.1f}s")
    with tempfile.NamedTemporaryFile(suffix=".pkl") as f:
        pickle.dump(groups, f)
        f.flush()
        print(f"{'configuration':<18} {'ran':<17} {'precision':>9} {'seq tok':>8} {'packed':>8} "
              f"{'bound':>6} {'step s':>7} {'seq tok/s':>10} {'packed tok/s':>12} {'peak MB':>8} "
              f"{'step MB':>8} {'gpu MB':>7}")
        for row in ROWS:
            if args.only and args.only not in row.name:
                continue
            if row.cuda_only and not torch.cuda.is_available():
                print(f"{row.name:<18} n/a here: FlexAttention has no backward on the CPU")
                continue
            out = subprocess.run([sys.executable, __file__, "--row", json.dumps(asdict(row)),
                                  "--groups-file", f.name, "--steps", str(args.steps),
                                  "--model", args.model],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            precision = row.config.get("precision", "fp32")
            print(f"{row.name:<18} {r['ran']:<17} {precision:>9} {r['seq']:>8.0f} "
                  f"{r['packed']:>8.0f} {r['seq'] / r['packed']:>5.2f}x "
                  f"{r['step_s']:>7.2f} {r['seq'] / r['step_s']:>10.0f} "
                  f"{r['packed'] / r['step_s']:>12.0f} {r['peak_mb']:>8.0f} "
                  f"{r['step_mb']:>8.0f} {r['gpu_mb']:>7.0f}")


if __name__ == "__main__":
    main()
