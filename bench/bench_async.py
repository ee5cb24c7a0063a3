"""The asynchronous RL loop against the synchronous one (issue 12).

Part 1, sync vs async on this machine: the same work (`--steps` optimizer steps of `--groups`
groups of `--k` samples, same seed, tasks and model: the bundled one on the embedded engine)
run by `envhub train --sync` and by the default asynchronous loop, one after the other, printed
side by side with their ratio:
    rollouts/s          rollouts of the trained groups per second of the loop (wall clock)
    trainer idle        fraction of the loop's wall clock the trainer spent waiting for groups
    reward / minute     sum of the trained rollouts' rewards per minute of the loop
    s / step            wall clock per optimizer step
Part 2, the group-aware scheduling simulation (bench/bench_async_sim.py, run with its
defaults): FIFO vs Seer (the product's own policies) vs an oracle that knows the lengths, tail
latency and makespan, and the tail ratio by samples per worker.

    .venv/bin/python bench/bench_async.py [--steps 4] [--groups 4] [--k 4] [--max-turns 4]
        [--part 1|2]

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


def run_loop(sync: bool, args: argparse.Namespace, out: Path,
             reset: bool | None = None) -> dict[str, float]:
    """One `envhub train` loop in this process; its figures from the step rows."""
    from envhub.orchestrator.train import TrainLoopConfig, train

    cfg = TrainLoopConfig(envs=["arith"], steps=args.steps, seed=args.seed, out=out,
                          groups=args.groups, k=args.k, concurrency=args.concurrency,
                          tasks=args.tasks, max_turns=args.max_turns, eval_every=0, sync=sync,
                          reset_optimizer=reset)
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
    """Three runs, one after the other: --sync (its default: no optimizer reset), the
    asynchronous default (reset after each push), and asynchronous without the reset (the
    loop's own effect, with the optimizer setting of --sync)."""
    load0 = os.getloadavg()
    runs: dict[str, dict[str, float]] = {}
    took: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        for name, sync, reset in (("sync", True, None), ("async", False, None),
                                  ("async no-reset", False, False)):
            t0 = time.perf_counter()
            runs[name] = run_loop(sync, args, Path(tmp) / name.replace(" ", "-"), reset)
            took[name] = time.perf_counter() - t0
    load1 = os.getloadavg()
    print(f"work: {args.steps} steps x {args.groups} groups x k={args.k} (arith, bundled model, "
          f"max turns {args.max_turns}, concurrency {args.concurrency}, seed {args.seed})")
    print(f"machine: {os.cpu_count()} cores; load average 1/5/15 min before "
          f"{'/'.join(f'{x:.1f}' for x in load0)}, after {'/'.join(f'{x:.1f}' for x in load1)}"
          "; runs with start-up: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))
    names = list(runs)
    print(f"\n{'':<22}" + "".join(f"{n:>16}" for n in names)
          + "".join(f"{n + '/sync':>22}" for n in names[1:]))
    for key in runs["sync"]:
        base = runs["sync"][key]
        ratios = [runs[n][key] / base if base else float("nan") for n in names[1:]]
        print(f"{key:<22}" + "".join(f"{runs[n][key]:>16.3f}" for n in names)
              + "".join(f"{r:>22.2f}" for r in ratios))


# ---------------------------------------------------------------------------------------------
# Part 2: group-aware scheduling simulation
# ---------------------------------------------------------------------------------------------


def part2() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_async_sim

    print("\n--- part 2: group-aware scheduling (simulation) ---")
    bench_async_sim.main([])


def main(argv: Any = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--part", type=int, choices=(1, 2), help="only this part (default: both)")
    args = ap.parse_args(argv)
    if args.part in (None, 1):
        part1(args)
    if args.part in (None, 2):
        part2()


if __name__ == "__main__":
    main()
