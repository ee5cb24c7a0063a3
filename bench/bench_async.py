"""The asynchronous RL loop against the synchronous one (issue 12).

Part 1, sync vs async on this machine: the same work (`--steps` optimizer steps of `--groups`
groups of `--k` samples, same seed, tasks and model: the bundled one on the embedded engine)
run by `envhub train --sync` and by the default asynchronous loop, one after the other, printed
side by side with their ratio:
    rollouts/s          rollouts of the trained groups per second of the loop (wall clock)
    trainer idle        fraction of the loop's wall clock the trainer spent waiting for groups
    reward / minute     sum of the trained rollouts' rewards per minute of the loop
    s / step            wall clock per optimizer step
Part 2 (to come, another helper): the group-aware scheduling simulation.

    .venv/bin/python bench/bench_async.py [--steps 4] [--groups 4] [--k 4] [--max-turns 4]

Print the machine's load with the figures: on a shared machine both loops slow down, and the
asynchronous one overlaps rollouts with training, so its gain depends on the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------
# Part 1: the same work, synchronous vs asynchronous
# ---------------------------------------------------------------------------------------------


def run_loop(sync: bool, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """One `envhub train` loop in this process; its figures from the step rows."""
    from envhub.train import TrainLoopConfig, train

    cfg = TrainLoopConfig(envs=["arith"], steps=args.steps, seed=args.seed, out=out,
                          groups=args.groups, k=args.k, concurrency=args.concurrency,
                          tasks=args.tasks, max_turns=args.max_turns, eval_every=0, sync=sync)
    rows = [r for r in train(cfg, log=lambda _: None) if r["phase"] == "train"]
    wall = rows[-1]["wall_s"]
    rollouts = sum(r["rollouts"] for r in rows)
    rewards = sum(r["reward_mean"] * (r["rollouts"] - r["env_failures"]) for r in rows)
    return {"wall s": wall, "s / step": wall / len(rows), "rollouts/s": rollouts / wall,
            "trainer idle": sum(r["rollout_s"] for r in rows) / wall,
            "reward / minute": rewards / (wall / 60),
            "mean reward": statistics.fmean(r["reward_mean"] for r in rows),
            "stale dropped": sum(r["filter/stale"] for r in rows),
            "mixed-version samples": sum(r["versions/mixed_samples"] for r in rows)}


def part1(args: argparse.Namespace) -> None:
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        t0 = time.perf_counter()
        sync = run_loop(True, args, Path(tmp) / "sync")
        t1 = time.perf_counter()
        asyn = run_loop(False, args, Path(tmp) / "async")
        t2 = time.perf_counter()
    load1 = os.getloadavg()
    print(f"work: {args.steps} steps x {args.groups} groups x k={args.k} (arith, bundled model, "
          f"max turns {args.max_turns}, concurrency {args.concurrency}, seed {args.seed})")
    print(f"machine: {os.cpu_count()} cores; load average 1/5/15 min before "
          f"{'/'.join(f'{x:.1f}' for x in load0)}, after {'/'.join(f'{x:.1f}' for x in load1)}"
          f"; runs (with start-up) {t1 - t0:.0f} s sync, {t2 - t1:.0f} s async")
    print(f"\n{'':<22}{'sync':>10}{'async':>10}{'async/sync':>12}")
    for key in sync:
        ratio = asyn[key] / sync[key] if sync[key] else float("nan")
        print(f"{key:<22}{sync[key]:>10.3f}{asyn[key]:>10.3f}{ratio:>12.2f}")


# ---------------------------------------------------------------------------------------------
# Part 2: group-aware scheduling simulation (not here yet)
# ---------------------------------------------------------------------------------------------


def main(argv: Any = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    part1(ap.parse_args(argv))


if __name__ == "__main__":
    main()
