"""Seer vs FIFO in a real run (issue 12; bench_async_sim.py is the simulation): the real
`envhub run` (in-process gateway on the zero-work backend, the runner, one command-line agent
process per rollout) on a long-tailed workload, FIFO and Seer interleaved over a few
repetitions, with the simulation's prediction for the same lengths beside the measurement.

Workload: G groups (the first G arith tasks) x k samples, C rollouts at once (G*k/C samples per
worker; Seer's gain needs about 8 or more, see bench_async_sim's sweep). Each rollout's agent is
this file (`agent` mode): it reads its sample index from its own session (GET /sessions/ID with
its key), makes a model call through its gateway session, works for a length fixed by
(seed, task id, sample) and makes a second call. Lengths: --base seconds x group scale
~ lognormal(0, --sigma-group) (drawn from the task id: samples of one prompt are alike) x
~ lognormal(0, --sigma-sample) per sample, capped at --cap x base. The work is waiting (a sleep):
the machine has 2 shared cores, and what is measured is the order rollouts start in. Both
policies of a repetition get the same lengths; each repetition a new seed; which policy runs
first alternates.

Every figure comes from the run's pool, none from the planned lengths: a rollout starts when its
session is created (the runner opens it as the rollout starts) and ends at its last model call's
turn. makespan = last end - first start; tail = makespan - the time 90% of the rollouts had
ended (the long tail Seer reports); group p50/p90/p99 = percentiles over groups of their last
rollout's end. Checked on every run: each rollout is done with its two turns, lasted at least
its planned length, and (Seer) every group's probe started before any other sample.

    .venv/bin/python bench/bench_schedule_real.py [--groups 16] [--k 4] [--concurrency 4]
        [--base 1.0] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

POLICIES = ("fifo", "seer")


def length(seed: int, task_id: str, sample: int, base: float, sigma_group: float,
           sigma_sample: float, cap: float) -> float:
    """The planned work (seconds) of one rollout: alike within a group, long-tailed across."""
    scale = random.Random(f"{seed}:{task_id}").lognormvariate(0.0, sigma_group)
    own = random.Random(f"{seed}:{task_id}:{sample}").lognormvariate(0.0, sigma_sample)
    return min(cap * base, base * scale * own)


# ---------------------------------------------------------------------------------------------
# agent mode: one rollout (stdlib only, so that the process starts fast)
# ---------------------------------------------------------------------------------------------


def agent(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("task_id")
    _workload_args(ap)
    a = ap.parse_args(argv)
    base_url, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    me = _http(f"{base_url.removesuffix('/v1')}/sessions/{os.environ['ENVHUB_SESSION_ID']}",
               key)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    reply = _http(f"{base_url}/chat/completions", key,
                  {"model": "default", "max_tokens": 4, "messages": messages})
    time.sleep(length(a.seed, a.task_id, int(me["sample_index"]), a.base, a.sigma_group,
                      a.sigma_sample, a.cap))
    messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Done."}]
    _http(f"{base_url}/chat/completions", key,
          {"model": "default", "max_tokens": 4, "messages": messages})
    return 0


def _http(url: str, key: str, body: dict | None = None) -> Any:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {key}",
                                          "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


# ---------------------------------------------------------------------------------------------
# bench mode
# ---------------------------------------------------------------------------------------------


def run_policy(schedule: str, seed: int, a: argparse.Namespace, tasks: list[str],
               out: Path) -> dict[str, float]:
    """One real `envhub run`; its figures, read from its pool."""
    workload = ["--seed", str(seed), "--base", str(a.base), "--sigma-group", str(a.sigma_group),
                "--sigma-sample", str(a.sigma_sample), "--cap", str(a.cap)]
    command = " ".join([sys.executable, str(Path(__file__).resolve()), "agent", "{task_id}",
                        *workload])
    done = subprocess.run(
        [sys.executable, "-m", "envhub", "run", "arith", "--model", "zero", "-n",
         str(a.groups), "-k", str(a.k), "-c", str(a.concurrency), "--schedule", schedule,
         "--agent", command, "--agent-on-host", "--out", str(out), "-q"],
        capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"envhub run --schedule {schedule} failed: {done.stderr[-3000:]}")
    return measure(out, schedule, seed, a, tasks)


def measure(out: Path, schedule: str, seed: int, a: argparse.Namespace,
            tasks: list[str]) -> dict[str, float]:
    from bench_async_sim import figures

    from envhub.gateway.pool.store import Store

    store = Store(f"sqlite:///{out / 'pool.db'}")
    try:
        sessions = store.list_sessions(limit=100_000)  # in start (creation) order
        turns = {s["id"]: store.turn_rows(s["id"]) for s in sessions}
    finally:
        store.close()
    if len(sessions) != a.groups * a.k or {s["task_id"] for s in sessions} != set(tasks):
        raise RuntimeError(f"{schedule}: {len(sessions)} sessions for {a.groups} x {a.k}")
    t0 = min(s["created_at"] for s in sessions)
    ends: list[float] = []
    group_end: dict[str, float] = {}
    over: list[float] = []
    for s in sessions:
        calls = turns[s["id"]]
        if s["status"] != "done" or len(calls) != 2:
            raise RuntimeError(f"{schedule}: session {s['id']} is {s['status']} with "
                               f"{len(calls)} turns ({s['reason']}); expected done with 2")
        end = max(t["created_at"] for t in calls)
        took = end - s["created_at"]
        planned = length(seed, s["task_id"], s["sample_index"], a.base, a.sigma_group,
                         a.sigma_sample, a.cap)
        if took < planned:
            raise RuntimeError(f"{schedule}: session {s['id']} took {took:.3f}s, less than its "
                               f"planned {planned:.3f}s: the records or the agent are wrong")
        over.append(took - planned)
        ends.append(end - t0)
        group_end[s["group_id"]] = max(end - t0, group_end.get(s["group_id"], 0.0))
    probes = [s["sample_index"] for s in sessions[:a.groups]]
    return {**figures(ends, group_end), "overhead s": statistics.fmean(over),
            "probes first": float(probes == [0] * a.groups)}


def simulated(seed: int, a: argparse.Namespace, tasks: list[str]) -> dict[str, dict[str, float]]:
    """The simulation's figures for the same lengths and workers (no overheads)."""
    from bench_async_sim import simulate

    from envhub.orchestrator.groups.scheduling import FifoPolicy, SeerPolicy

    lengths = {(f"g{g}", i): length(seed, t, i, a.base, a.sigma_group, a.sigma_sample, a.cap)
               for g, t in enumerate(tasks) for i in range(a.k)}
    return {name: simulate(policy, lengths, a.groups, a.k, a.concurrency)
            for name, policy in (("fifo", FifoPolicy()), ("seer", SeerPolicy()))}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["agent"]:
        sys.exit(agent(argv[1:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4, help="rollouts at once")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (seeds 0..reps-1)")
    _workload_args(ap, seed=False)
    a = ap.parse_args(argv)
    from envhub.envs.loader import load_env

    tasks = [t.id for t in load_env("arith").env.load_tasks()[:a.groups]]
    load0, started = os.getloadavg(), time.perf_counter()
    real: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
    sim: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
    with tempfile.TemporaryDirectory(prefix="bench-schedule-") as tmp:
        for rep in range(a.reps):
            order = POLICIES if rep % 2 == 0 else POLICIES[::-1]
            for policy in order:
                real[policy].append(run_policy(policy, rep, a, tasks,
                                               Path(tmp) / f"{rep}-{policy}"))
            for policy, figs in simulated(rep, a, tasks).items():
                sim[policy].append(figs)
            f, s = real["fifo"][-1], real["seer"][-1]
            print(f"rep {rep} (seed {rep}, {' then '.join(order)}): makespan fifo "
                  f"{f['makespan']:.2f}s seer {s['makespan']:.2f}s "
                  f"({s['makespan'] / f['makespan']:.2f}); tail fifo {f['tail']:.2f}s seer "
                  f"{s['tail']:.2f}s ({s['tail'] / f['tail']:.2f})", flush=True)
    report(a, real, sim, load0, time.perf_counter() - started)


def report(a: argparse.Namespace, real: dict[str, list[dict[str, float]]],
           sim: dict[str, list[dict[str, float]]], load0: tuple[float, float, float],
           took: float) -> None:
    mean = {p: {k: statistics.fmean(r[k] for r in rs) for k in rs[0]} for p, rs in real.items()}
    sim_mean = {p: {k: statistics.fmean(r[k] for r in rs) for k in rs[0]}
                for p, rs in sim.items()}
    n = a.groups * a.k
    print(f"\nworkload: real `envhub run`, {a.groups} groups x k={a.k} = {n} rollouts, "
          f"{a.concurrency} at once ({n / a.concurrency:g} per worker); work {a.base:g}s x "
          f"lognormal(sigma {a.sigma_group:g} between groups, {a.sigma_sample:g} within), cap "
          f"{a.cap:g}x; mean of {a.reps} repetitions (seeds 0..{a.reps - 1}), policies "
          "alternating")
    print(f"machine: {os.cpu_count()} cores; load average 1/5/15 min before "
          f"{'/'.join(f'{x:.2f}' for x in load0)}, after "
          f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}; bench wall {took:.0f}s")
    print(f"\n{'(seconds)':<14}{'fifo':>9}{'seer':>9}{'seer/fifo':>11}"
          f"{'sim fifo':>10}{'sim seer':>10}{'sim seer/fifo':>15}")
    for key in ("makespan", "tail", "group p50", "group p90", "group p99"):
        f, s = mean["fifo"][key], mean["seer"][key]
        sf, ss = sim_mean["fifo"][key], sim_mean["seer"][key]
        print(f"{key:<14}{f:>9.2f}{s:>9.2f}{s / f:>11.2f}{sf:>10.2f}{ss:>10.2f}{ss / sf:>15.2f}")
    print(f"overhead per rollout (measured - planned length): fifo "
          f"{mean['fifo']['overhead s']:.3f}s, seer {mean['seer']['overhead s']:.3f}s")
    probes = sum(r["probes first"] for r in real["seer"])
    print(f"seer runs whose first {a.groups} rollouts were the {a.groups} probes: "
          f"{probes:.0f}/{a.reps}")
    change = mean["seer"]["tail"] / mean["fifo"]["tail"] - 1
    print(f"long tail, Seer vs FIFO (real): {100 * change:+.0f}%")


def _workload_args(ap: argparse.ArgumentParser, seed: bool = True) -> None:
    if seed:
        ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--base", type=float, default=1.0, help="seconds of a median group")
    ap.add_argument("--sigma-group", type=float, default=1.0)
    ap.add_argument("--sigma-sample", type=float, default=0.3)
    ap.add_argument("--cap", type=float, default=10.0, help="longest rollout, in base units")


if __name__ == "__main__":
    main()
