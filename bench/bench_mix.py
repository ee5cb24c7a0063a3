"""Trained mix under a slow task (issue 26): `envhub train service:a=3 service:b=1` with two
task services in processes of their own, b's rollouts about `--slow` times a's, once with
static launch ratios (`--mix static`) and once with dynamic ones (`--mix dynamic`), same seed,
same settings, side by side.

Both services are the JavaScript echo service (orchestrator/groups/services/node): one model
turn through the run's gateway (the bundled model, really sampled and trained), graded with
partial credit; b waits `delay_b` ms before its turn. The delay is set from a calibration run
(`envhub run service:a`, the same concurrency) so that b's mean rollout takes `--slow` times
a's; the durations measured in the training runs themselves are printed.

The targets are shares of trained samples (3:1, a at 0.75). A sample counts as trained when
the trainer's filters keep it (not stale, failed, or in a no-signal or under-half group),
counted by the loop for both modes alike (metrics.jsonl, `mix/<env>/...`).

    .venv/bin/python bench/bench_mix.py [--steps 20] [--slow 10] [--window 0] [--tau 1]
                                        [--buffer 16]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "orchestrator" / "groups" / "services" / "node" / "echo_service.mjs"
TOKEN = {"ENVHUB_SERVICES_TOKEN": "bench-mix-services-token-01"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def services(port: int, delay_a: int, delay_b: int) -> list[subprocess.Popen]:
    url = f"http://127.0.0.1:{port}"
    return [subprocess.Popen(["node", str(NODE), "--orchestrator", url, "--name", name,
                              "--delay-ms", str(delay), "--capacity", "256"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, **TOKEN})
            for name, delay in (("a", delay_a), ("b", delay_b))]


def envhub(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "envhub", *args], env={**os.environ, **TOKEN},
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"envhub {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")


def durations(folder: Path) -> dict[str, float]:
    """Mean rollout duration per environment from a run's or training's records."""
    seen: dict[str, list[float]] = {}
    for f in (folder / "rollouts").glob("*.json"):
        rec = json.loads(f.read_text())
        seen.setdefault(rec["env"], []).append(rec["duration_s"])
    return {env: statistics.fmean(xs) for env, xs in seen.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--slow", type=float, default=10.0, help="b's rollouts / a's")
    ap.add_argument("--delay-a", type=int, default=2000, help="a's delay per rollout (ms)")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--window", type=int, default=0, help="0: greedy (any finished group)")
    ap.add_argument("--tau", type=int, default=1)
    ap.add_argument("--buffer", type=int, default=16, help="groups launched and not yet "
                    "trained (the default for tau 1 is one step's: a synchronous loop)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="envhub-bench-mix-"))
    port = free_port()
    where = f"127.0.0.1:{port}"

    # calibration: a's rollout time at this concurrency, model turn included
    procs = services(port, a.delay_a, a.delay_a)
    try:
        time.sleep(1)
        envhub("run", "service:a", "--services", where, "-n", str(a.concurrency // a.k),
               "-k", str(a.k), "-c", str(a.concurrency), "-q", "--out", str(root / "calib"))
    finally:
        for p in procs:
            p.kill()
    t_a = durations(root / "calib")["a"]
    model_s = max(0.0, t_a - a.delay_a / 1000)
    delay_b = int(1000 * (a.slow * t_a - model_s))
    print(f"calibration: a's rollout {t_a:.2f} s (delay {a.delay_a} ms + model "
          f"{model_s:.2f} s); b's delay {delay_b} ms for {a.slow:g}x")

    results = {}
    for mix in ("static", "dynamic"):
        out = root / mix
        procs = services(port, a.delay_a, delay_b)
        started = time.perf_counter()
        try:
            time.sleep(1)
            envhub("train", "service:a=3", "service:b=1", "--services", where, "--steps",
                   str(a.steps), "--groups", str(a.groups), "--k", str(a.k), "--concurrency",
                   str(a.concurrency), "--window", str(a.window), "--tau", str(a.tau),
                   "--buffer", str(a.buffer), "--eval-every", "0", "--seed", str(a.seed),
                   "--mix", mix, "--out", str(out))
        finally:
            for p in procs:
                p.kill()
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rows = [r for r in rows if r.get("phase") == "train"]
        results[mix] = (rows, durations(out), time.perf_counter() - started)

    print(f"\n{a.steps} steps, {a.groups} groups x k={a.k}, concurrency {a.concurrency}, "
          f"window {a.window or 'greedy'}, tau {a.tau}, buffer {a.buffer}; target a:b = 3:1 "
          "(a's share 0.750)")
    print(f"{'':34}{'static':>14}{'dynamic':>14}")
    static, dynamic = results["static"], results["dynamic"]

    def line(label: str, fn) -> None:
        print(f"{label:34}{fn(static):>14}{fn(dynamic):>14}")

    def share(rows: list[dict], step: int) -> float:
        return float(rows[step]["mix/a/trained_share"])

    def ratio(res) -> str:
        last = res[0][-1]
        b = last["mix/b/trained_samples"]
        return f"{last['mix/a/trained_samples'] / b:.2f}:1" if b else "inf"

    line("trained a:b (all steps)", ratio)
    line("a's trained share, step 10", lambda r: f"{share(r[0], min(9, len(r[0]) - 1)):.3f}")
    line("a's trained share, last step", lambda r: f"{share(r[0], -1):.3f}")
    line("groups launched a / b", lambda r: f"{r[0][-1]['mix/a/launched_groups']:.0f} / "
                                            f"{r[0][-1]['mix/b/launched_groups']:.0f}")
    line("mean rollout s a / b", lambda r: f"{r[1].get('a', 0):.1f} / {r[1].get('b', 0):.1f}")
    line("stale samples dropped", lambda r: f"{sum(x['filter/stale'] for x in r[0]):.0f}")
    line("no-signal groups", lambda r: f"{sum(x['filter/no_signal_groups'] for x in r[0]):.0f}")
    line("wall s", lambda r: f"{r[2]:.0f}")
    print(f"(results under {root})")


if __name__ == "__main__":
    main()
