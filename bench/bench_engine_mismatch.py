"""Train/inference mismatch seen by the IS mask: the embedded engine vs a real vLLM (issue 12).

Runs the real command line twice on the same model, seed and tasks, one after the other (each
run wants every core): `envhub train arith --engine embedded` and `--engine vllm`, then prints
per step, side by side, what the trainer measured between the rollout logprobs (recorded by
the engine) and its own: `is/masked_fraction` (tokens whose ratio left [1-eps_l, 1+eps_h]),
`is/ratio_{mean,std,min,max}` and `kl/rollout_train_k3`, with vLLM's ratio spread over the
embedded engine's. The embedded engine computes logprobs with the same torch code as the
trainer, so its step-0 mismatch is float noise; vLLM's kernels (and dtype) differ.

    .venv/bin/python bench/bench_engine_mismatch.py [--steps 4] [--seed 0] [--model DIR]
        [--runs DIR] [-- more envhub train options]
    .venv/bin/python bench/bench_engine_mismatch.py --summarise DIR   # runs already made

Without --model, tiny64 (scripts/build_tiny64_model.py, head_dim 64) is built into the runs
folder: vLLM's CPU attention refuses the bundled model's head_dim 16. `--model` of
scripts/build_arith64_model.py's output compares on the arith policy itself.

Measured here (2026-11-23, 2 shared cores at load ~11-14, `--steps 4 --seed 0 --groups 2 --k 4
-- --max-turns 2|3`, vLLM in bf16, the trainer in fp32): ratio std over trained steps, embedded
3.9e-6 vs vLLM 0.051 on tiny64 (ratios 0.75..1.51, 0.49% masked at one step), 1.3e-6 vs 0.0083
on arith64 (ratios 0.85..1.11, none masked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("embedded", "vllm")
COLUMNS = [("masked", "trainer/is/masked_fraction"), ("r_mean", "trainer/is/ratio_mean"),
           ("r_std", "trainer/is/ratio_std"), ("r_min", "trainer/is/ratio_min"),
           ("r_max", "trainer/is/ratio_max"), ("kl_k3", "trainer/kl/rollout_train_k3")]


def steps_of(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    return [r for r in rows if r.get("phase") == "train"]


def run(engine: str, model: Path, out: Path, args: argparse.Namespace) -> float:
    cmd = [sys.executable, "-m", "envhub", "train", "arith", "--engine", engine,
           "--model", str(model), "--steps", str(args.steps), "--seed", str(args.seed),
           "--groups", str(args.groups), "--k", str(args.k), "--eval-every", "0", "--sync",
           "--out", str(out), *args.extra]
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return time.perf_counter() - t0


def summarise(runs: Path) -> None:
    """One line per step and engine; a step whose groups all lacked signal trained nothing
    (`step/skipped`), so it has no ratios."""
    table = {e: steps_of(runs / e) for e in ENGINES}
    print(f"{'step':>4}  {'engine':<8}  {'tokens':>6}  " +
          "  ".join(f"{name:>9}" for name, _ in COLUMNS) + "  resolved")
    for i in range(min(len(t) for t in table.values())):
        for e in ENGINES:
            r = table[e][i]
            tokens = int(r.get("trainer/tokens/naive", 0))
            cells = ("  ".join(f"{r.get(key, float('nan')):>9.4g}" for _, key in COLUMNS)
                     if tokens else f"{'(skipped: no group had signal)':>{11 * len(COLUMNS) - 2}}")
            print(f"{i:>4}  {e:<8}  {tokens:>6}  {cells}  {r['resolved_rate']:.2f}")
    trained = {e: [r for r in table[e] if r.get("trainer/tokens/naive", 0)] for e in ENGINES}
    if all(trained.values()):
        std = {e: statistics.fmean(r["trainer/is/ratio_std"] for r in trained[e])
               for e in ENGINES}
        masked = {e: statistics.fmean(r["trainer/is/masked_fraction"] for r in trained[e])
                  for e in ENGINES}
        ratio = f"{std['vllm'] / std['embedded']:.3g}x" if std["embedded"] else "inf"
        print(f"\nover trained steps: ratio std embedded {std['embedded']:.3g}, vllm "
              f"{std['vllm']:.3g} (vllm / embedded {ratio}); masked fraction embedded "
              f"{masked['embedded']:.4f}, vllm {masked['vllm']:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--model", type=Path, help="HF model folder vLLM can serve")
    parser.add_argument("--runs", type=Path, help="where the two runs go (default: runs/...)")
    parser.add_argument("--summarise", type=Path, help="only print the table of DIR's runs")
    parser.add_argument("extra", nargs="*", help="more envhub train options (after --)")
    args = parser.parse_args()
    if args.summarise:
        summarise(args.summarise)
        return
    runs = args.runs or ROOT / "runs" / f"engine-mismatch-{time.strftime('%Y%m%d-%H%M%S')}"
    runs.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        model = runs / "tiny64"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_tiny64_model.py"),
                        "--out", str(model)], check=True)
    took = {e: run(e, model, runs / e, args) for e in ENGINES}
    print(f"\nwall: embedded {took['embedded']:.0f} s, vllm {took['vllm']:.0f} s "
          f"(vllm includes its start-up)\n")
    summarise(runs)


if __name__ == "__main__":
    main()
