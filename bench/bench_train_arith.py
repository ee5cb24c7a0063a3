"""`envhub train arith` over several seeds (issue 7): does the mean reward rise?

Runs the real command line — embedded gateway + engine, built-in agent rollouts, trainer,
weight sync through POST /admin/weights — once per seed, one after the other (each run wants
every core), then reads each run's OUT/metrics.jsonl and prints, side by side, the mean
reward (and solved rate) of the first and the last `--window` steps, their difference, and
the difference's mean and spread (sample std, min, max) over the seeds.

    .venv/bin/python bench/bench_train_arith.py [--seeds 0 1 2] [--steps 30] [--window 10]
        [--tasks 40] [-- more envhub train options]
    .venv/bin/python bench/bench_train_arith.py --runs DIR   # summarise runs already made

Each seed's run lands in DIR/seed-S (default: a fresh folder under runs/).
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


def read_metrics(folder: Path) -> list[dict]:
    """The step rows (held-out evaluation rows, `"phase": "eval"`, are left out)."""
    path = folder / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("phase", "train") == "train"]


def mean_of(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def solved_by_family(folder: Path, steps: int, window: int) -> dict[str, tuple[float, float]]:
    """Per arith family: solved rate of the rollouts of the first and last `window` steps,
    read from the run's pool (groups in start order, `rows` groups per step)."""
    from envhub.envs.loader import load_env
    from envhub.trainer.source import StoreSource

    tasks = {t.id: t.data.get("family", "") for t in load_env("arith").env.load_tasks()}
    with StoreSource(f"sqlite:///{folder / 'pool.db'}") as pool:
        groups = pool.list_groups()
        per_step = len(groups) // steps
        ends = {"first": groups[:window * per_step], "last": groups[-window * per_step:]}
        tally: dict[str, dict[str, list[int]]] = {}
        for end, chosen in ends.items():
            for g in chosen:
                for t in pool.fetch([s.id for s in g.sessions]):
                    family = tasks.get(t.session.task_id or "", "")
                    solved = any(r.kind == "outcome" and r.value >= 1.0 for r in t.rewards)
                    n = tally.setdefault(family, {}).setdefault(end, [0, 0])
                    n[0] += 1
                    n[1] += solved
    return {f: (v["first"][1] / v["first"][0], v["last"][1] / v["last"][0])
            for f, v in sorted(tally.items())}


def summarise(runs: dict[int, list[dict]], window: int,
              folders: dict[int, Path] | None = None) -> None:
    print(f"\n{'seed':>4} {'steps':>5} {'first':>7} {'last':>7} {'margin':>7}   "
          f"{'solved first':>12} {'solved last':>11}   {'IS masked':>9} {'s/step':>6}")
    margins = []
    for seed, rows in sorted(runs.items()):
        if len(rows) < 2 * window:
            print(f"{seed:>4} {len(rows):>5}  (fewer than {2 * window} steps: skipped)")
            continue
        first, last = rows[:window], rows[-window:]
        margin = mean_of(last, "reward_mean") - mean_of(first, "reward_mean")
        margins.append(margin)
        masked = statistics.fmean(r.get("trainer/is/masked_fraction", 0.0) for r in rows)
        per_step = statistics.fmean(r["rollout_s"] + r["train_s"] for r in rows)
        print(f"{seed:>4} {len(rows):>5} {mean_of(first, 'reward_mean'):>7.3f} "
              f"{mean_of(last, 'reward_mean'):>7.3f} {margin:>+7.3f}   "
              f"{mean_of(first, 'resolved_rate'):>12.3f} {mean_of(last, 'resolved_rate'):>11.3f}"
              f"   {masked:>9.4f} {per_step:>6.1f}")
    if margins:
        spread = statistics.stdev(margins) if len(margins) > 1 else 0.0
        print(f"\nmargin (mean reward, last {window} steps - first {window}) over "
              f"{len(margins)} seeds: {statistics.fmean(margins):+.3f} ± {spread:.3f} (sample "
              f"std), min {min(margins):+.3f}, max {max(margins):+.3f}")
    if folders:
        print(f"\nsolved rate by problem family, first {window} steps -> last {window}:")
        for seed, folder in sorted(folders.items()):
            if len(runs[seed]) >= 2 * window and (folder / "pool.db").is_file():
                rates = solved_by_family(folder, len(runs[seed]), window)
                print(f"  seed {seed}: " + ", ".join(f"{f} {a:.2f} -> {b:.2f}"
                                                    for f, (a, b) in rates.items()))
    print("\nreward per step (mean of the step's rollouts):")
    for seed, rows in sorted(runs.items()):
        print(f"  seed {seed}: " + " ".join(f"{r['reward_mean']:.2f}" for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--window", type=int, default=10, help="steps averaged at each end")
    ap.add_argument("--tasks", type=int, default=40, help="train on the first N arith tasks: "
                    "with 8 groups a step, every 5 steps pass over all 40 once, so both "
                    "10-step windows see the same tasks (twice each)")
    ap.add_argument("--runs", type=Path, help="folder of seed-S runs: summarise, run nothing")
    ap.add_argument("--out", type=Path, help="where the runs go (default runs/bench-train-*)")
    ap.add_argument("extra", nargs="*", help="more `envhub train` options, after --")
    args = ap.parse_args()
    if args.runs is not None:
        folders = {int(p.name.split("-", 1)[1]): p for p in sorted(args.runs.glob("seed-*"))
                   if (p / "metrics.jsonl").is_file()}
        if not folders:
            ap.error(f"--runs {args.runs}: no seed-*/metrics.jsonl inside")
        summarise({s: read_metrics(p) for s, p in folders.items()}, args.window, folders)
        return
    out = args.out or ROOT / "runs" / time.strftime("bench-train-%Y%m%d-%H%M%S")
    runs = {}
    for seed in args.seeds:
        folder = out / f"seed-{seed}"
        started = time.monotonic()
        cmd = [sys.executable, "-m", "envhub", "train", "arith", "--steps", str(args.steps),
               "--seed", str(seed), "--out", str(folder), "--tasks", str(args.tasks),
               *args.extra]
        print(f"seed {seed}: {' '.join(cmd[2:])}", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "train.log", "w") as log:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=ROOT)
        runs[seed] = read_metrics(folder)
        print(f"seed {seed}: {len(runs[seed])} steps in {time.monotonic() - started:.0f}s "
              f"(log: {folder / 'train.log'})", flush=True)
    summarise(runs, args.window, {seed: out / f"seed-{seed}" for seed in runs})


if __name__ == "__main__":
    main()
