"""The objectives side by side (issue 41): `envhub train arith` with each loss x estimator pair
that makes sense, several seeds each, the same steps, in one run of this script.

For each objective and seed it reads OUT/metrics.jsonl and prints: the reward margin (mean
reward of the last `--window` steps minus the first `--window`), the held-out evaluation's
change (solved rate after the last step minus before the first), the mean IS masked fraction
(tokens whose gradient the loss cut: masked or clipped; 0 for cispo by construction), and
seconds per step; then per objective the margins' mean and spread (population std over seeds)
and the same for the evaluation change. The objectives:

    default   --loss is_mask, grpo advantages r - mean (the run's defaults)
    ppo_clip  --loss ppo_clip
    gspo      --loss gspo --loss-agg seq_mean (the paper's aggregation)
    cispo     --loss cispo
    dr_grpo   --loss-agg constant (with the default r - mean: Dr.GRPO)
    rloo      --advantage rloo

    .venv/bin/python bench/bench_algorithms.py [--seeds 0 1 2] [--steps 20] [--window 10]
        [--only default cispo] [--out DIR] [-- more envhub train options]
    .venv/bin/python bench/bench_algorithms.py --runs DIR   # print runs already made

Runs go one after another (the machine has few cores; runs side by side would time each
other's load), each into DIR/OBJECTIVE/seed-S.
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
OBJECTIVES: dict[str, list[str]] = {
    "default": [],
    "ppo_clip": ["--loss", "ppo_clip"],
    "gspo": ["--loss", "gspo", "--loss-agg", "seq_mean"],
    "cispo": ["--loss", "cispo"],
    "dr_grpo": ["--loss-agg", "constant"],
    "rloo": ["--advantage", "rloo"],
}
# small enough that 6 objectives x 3 seeds run in well under an hour on 2 cores; 4 x 4
# samples a step so that most steps have groups with signal
RUN = ["--groups", "4", "--k", "4", "--tasks", "40", "--eval-tasks", "16", "--eval-samples",
       "2", "--concurrency", "8", "--quiet"]


def rows_of(folder: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x]
    return ([r for r in rows if r.get("phase") == "train"],
            [r for r in rows if r.get("phase") == "eval"])


def summary(folder: Path, window: int) -> dict[str, float]:
    train, evals = rows_of(folder)
    first, last = train[:window], train[-window:]
    masked = [r.get("trainer/is/masked_fraction", 0.0) for r in train
              if not r.get("trainer/step/skipped")]
    eval_change = (evals[-1]["eval/resolved_rate"] - evals[0]["eval/resolved_rate"]
                   if len(evals) >= 2 else float("nan"))
    return {
        "margin": statistics.fmean(r["reward_mean"] for r in last)
        - statistics.fmean(r["reward_mean"] for r in first),
        "eval_change": eval_change,
        "masked": statistics.fmean(masked) if masked else 0.0,
        "s_per_step": train[-1]["wall_s"] / len(train),
        "trained_steps": float(len(masked)),
    }


def run_one(out: Path, name: str, seed: int, steps: int, extra: list[str]) -> None:
    folder = out / name / f"seed-{seed}"
    if (folder / "metrics.jsonl").exists():
        return
    cmd = [sys.executable, "-m", "envhub", "train", "arith", "--steps", str(steps), "--seed",
           str(seed), "--eval-every", str(steps), "--out", str(folder), "--overwrite", *RUN,
           *OBJECTIVES[name], *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} seed {seed} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(f"  ran {name} seed {seed} in {time.perf_counter() - t0:.0f}s", flush=True)


def spread(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "n/a"
    return f"{statistics.fmean(xs):+.3f} ± {statistics.pstdev(xs):.3f}"


def report(out: Path, names: list[str], seeds: list[int], window: int) -> None:
    print(f"\n{'objective':<10} {'seed':>4} {'margin':>8} {'eval Δ':>8} {'masked':>7} "
          f"{'s/step':>7} {'trained':>7}")
    table: dict[str, list[dict[str, float]]] = {}
    for name in names:
        for seed in seeds:
            folder = out / name / f"seed-{seed}"
            if not (folder / "metrics.jsonl").exists():
                continue
            s = summary(folder, window)
            table.setdefault(name, []).append(s)
            print(f"{name:<10} {seed:>4} {s['margin']:>+8.3f} {s['eval_change']:>+8.3f} "
                  f"{s['masked']:>7.3f} {s['s_per_step']:>7.2f} {int(s['trained_steps']):>7}")
    print(f"\n{'objective':<10} {'margin (mean ± std over seeds)':>32} {'eval Δ':>18} "
          f"{'masked':>7} {'s/step':>7}")
    for name, rows in table.items():
        print(f"{name:<10} {spread([r['margin'] for r in rows]):>32} "
              f"{spread([r['eval_change'] for r in rows]):>18} "
              f"{statistics.fmean(r['masked'] for r in rows):>7.3f} "
              f"{statistics.fmean(r['s_per_step'] for r in rows):>7.2f}")


def main() -> None:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--only", nargs="+", choices=sorted(OBJECTIVES))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--runs", type=Path, help="print the runs in this folder, run nothing")
    args = ap.parse_args(argv)
    names = args.only or list(OBJECTIVES)
    if args.runs is not None:
        report(args.runs, names, args.seeds, args.window)
        return
    out = args.out or ROOT / "runs" / f"algorithms-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"runs in {out}: {len(names)} objectives x {len(args.seeds)} seeds, {args.steps} "
          f"steps each")
    for seed in args.seeds:  # seeds outermost: a partial bench still compares every objective
        for name in names:
            run_one(out, name, seed, args.steps, extra)
    report(out, names, args.seeds, args.window)


if __name__ == "__main__":
    main()
