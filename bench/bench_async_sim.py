"""bench_async --sim: group-aware rollout scheduling (Seer) against FIFO and an oracle, in a
discrete-event simulation (issue 12, part 2 of bench/bench_async.py; runs on its own too).

The policies are the product's (orchestrator/groups/scheduling.py: FifoPolicy,
SeerPolicy); the oracle
(here) knows every sample's length and starts the longest first (LPT). Workload: G groups x k
samples, N workers each running one sample at a time; a group's lengths are correlated (samples
of one prompt): group scale ~ lognormal(0, sigma_g), sample = scale x lognormal(0, sigma_s),
in units of work (think decode seconds). Seer's probe reports the probe's own length.

Printed per policy, mean over seeds, and as ratios to FIFO:
    makespan        time the last sample ends (the synchronous step's rollout phase)
    tail            makespan - time 90% of the samples had ended: the long tail Seer reports
                    (-75...-93% long-tail latency vs veRL, whose rollout order is FIFO)
    group p50/p90/p99  completion time of a group (its last sample), percentiles over groups
    idle            fraction of worker-time idle before the makespan

Then a sweep over the load (samples per worker: Seer's gain grows with the queue behind each
worker, its setting being memory-bound concurrency far below the batch size).

    python bench/bench_async_sim.py [--groups 32] [--k 8] [--workers 32] [--seeds 20]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections.abc import Callable
from typing import Any

from envhub.orchestrator.groups.scheduling import (
    FifoPolicy,
    Observation,
    SchedulePolicy,
    SeerPolicy,
)


class OraclePolicy:
    """Knows every length: longest first over all samples (LPT)."""

    def __init__(self, lengths: dict[tuple[str, int], float]) -> None:
        self._lengths = lengths
        self._queue: list[tuple[float, int, str, int]] = []

    def add_group(self, group: str, k: int) -> None:
        for i in range(k):
            heapq.heappush(self._queue, (-self._lengths[group, i], len(self._queue), group, i))

    def next(self) -> tuple[str, int] | None:
        if not self._queue:
            return None
        _, _, group, index = heapq.heappop(self._queue)
        return group, index

    def finished(self, group: str, index: int, shown: Observation) -> None:
        return None


def workload(groups: int, k: int, sigma_g: float, sigma_s: float, seed: int
             ) -> dict[tuple[str, int], float]:
    rng = random.Random(seed)
    lengths = {}
    for g in range(groups):
        scale = rng.lognormvariate(0.0, sigma_g)
        for i in range(k):
            lengths[f"g{g}", i] = scale * rng.lognormvariate(0.0, sigma_s)
    return lengths


def simulate(policy: SchedulePolicy, lengths: dict[tuple[str, int], float], groups: int, k: int,
             workers: int) -> dict[str, float]:
    """All groups arrive at t=0 (a synchronous step's batch); a free worker takes
    `policy.next()`; a finished sample is reported to the policy before workers refill."""
    for g in range(groups):
        policy.add_group(f"g{g}", k)
    running: list[tuple[float, str, int]] = []  # (end time, group, index)
    now, busy, ends = 0.0, 0.0, []
    group_end: dict[str, float] = {}

    def fill() -> None:
        nonlocal busy
        while len(running) < workers:
            nxt = policy.next()
            if nxt is None:
                return
            length = lengths[nxt]
            busy += length
            heapq.heappush(running, (now + length, *nxt))

    fill()
    while running:
        now, group, index = heapq.heappop(running)
        ends.append(now)
        group_end[group] = max(now, group_end.get(group, 0.0))
        policy.finished(group, index, Observation(seconds=lengths[group, index]))
        fill()
    figs = figures(ends, group_end)
    return {**figs, "idle": 1 - busy / (workers * figs["makespan"])}


def figures(ends: list[float], group_end: dict[str, float]) -> dict[str, float]:
    """Makespan, tail and group completion percentiles from every sample's end time and every
    group's (its last sample's), all measured from the batch's start (bench_schedule_real.py
    computes the same from a real run's pool)."""
    ends = sorted(ends)
    makespan = ends[-1]
    done_90 = ends[max(0, int(0.9 * len(ends)) - 1)]
    per_group = sorted(group_end.values())
    return {"makespan": makespan, "tail": makespan - done_90,
            "group p50": _pct(per_group, 50), "group p90": _pct(per_group, 90),
            "group p99": _pct(per_group, 99)}


def _pct(sorted_values: list[float], p: float) -> float:
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[int(p) - 1]


def compare(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    makers: dict[str, Callable[[dict[tuple[str, int], float]], Any]] = {
        "fifo": lambda _: FifoPolicy(),
        "seer": lambda _: SeerPolicy(measure="seconds"),
        "oracle": OraclePolicy,
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in makers}
    for seed in range(args.seeds):
        lengths = workload(args.groups, args.k, args.sigma_group, args.sigma_sample, seed)
        for name, make in makers.items():
            runs[name].append(simulate(make(lengths), lengths, args.groups, args.k, args.workers))
    return {name: {key: statistics.fmean(r[key] for r in rs) for key in rs[0]}
            for name, rs in runs.items()}


def main(argv: Any = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--workers", type=int, default=32, help="samples running at once")
    ap.add_argument("--sigma-group", type=float, default=1.0,
                    help="lognormal sigma of a group's length scale (between prompts)")
    ap.add_argument("--sigma-sample", type=float, default=0.3,
                    help="lognormal sigma within a group (samples of one prompt)")
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args(argv)
    means = compare(args)
    print(f"simulation: {args.groups} groups x k={args.k} on {args.workers} workers; lengths "
          f"lognormal (between groups sigma {args.sigma_group:g}, within sigma "
          f"{args.sigma_sample:g}); mean of {args.seeds} seeds")
    names = list(means)
    print(f"{'':<12}" + "".join(f"{n:>10}" for n in names)
          + "".join(f"{n + '/fifo':>14}" for n in names[1:]))
    for key in means["fifo"]:
        base = means["fifo"][key]
        print(f"{key:<12}" + "".join(f"{means[n][key]:>10.3f}" for n in names)
              + "".join(f"{means[n][key] / base if base else float('nan'):>14.2f}"
                        for n in names[1:]))
    seer, fifo = means["seer"]["tail"], means["fifo"]["tail"]
    print(f"long tail, Seer vs FIFO: {100 * (seer / fifo - 1):+.0f}% "
          "(Seer's paper: -75...-93% vs veRL on its production workloads)")
    sweep(args)


def sweep(args: argparse.Namespace) -> None:
    samples = args.groups * args.k
    print(f"\nsweep over load ({samples} samples):")
    print(f"{'samples/worker':>15}{'workers':>9}{'tail seer/fifo':>16}{'oracle/fifo':>13}"
          f"{'makespan seer/fifo':>20}{'oracle/fifo':>13}")
    for per_worker in (2, 4, 8, 16, 32):
        workers = max(1, samples // per_worker)
        m = compare(argparse.Namespace(**{**vars(args), "workers": workers}))
        print(f"{per_worker:>15}{workers:>9}"
              f"{m['seer']['tail'] / m['fifo']['tail']:>16.2f}"
              f"{m['oracle']['tail'] / m['fifo']['tail']:>13.2f}"
              f"{m['seer']['makespan'] / m['fifo']['makespan']:>20.2f}"
              f"{m['oracle']['makespan'] / m['fifo']['makespan']:>13.2f}")


if __name__ == "__main__":
    main()
