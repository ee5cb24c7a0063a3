"""Many rollouts in flight in one orchestrator process (issue 26): the real `envhub run` on arith
with the in-process gateway on the zero-work backend (instant completions), the environment's
in-memory sandbox and the tool-calling agent, `--concurrency` as large as the rollout count.
The work per rollout is the orchestrator's and the gateway's own: a session opened, one model
call, verification, rewards posted, the session closed.

The same rollouts are then spread over task services (`--services N`, default 2): N
`envhub serve arith` processes registered with the run (`service:arith --services HOST:PORT`),
each running its share of the rollouts (agent, sandbox, grading) while the run keeps the
gateway, the pool and the scoring. Both lines print side by side.

Measured from outside the processes (sampled every 0.2 s from /proc): peak RSS and peak open
file descriptors, of the run and of each service. From its results: rollouts per minute
(wall clock of the whole command) and every rollout's status, with the reasons of any that
are not done. From its pool: the most sessions open at once (a session is open from its
rollout's start until its group is scored).

    .venv/bin/python bench/bench_inflight.py [--rollouts 1000] [--k 5] [--services 2]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def sample(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open file descriptors) of `pid` now; (0, 0) once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return 0, 0


def most_open(db: Path) -> int:
    """The most sessions open at the same time, from the pool's created/closed times."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT created_at, closed_at FROM sessions").fetchall()
    events = sorted([(c, 1) for c, _ in rows] + [(x, -1) for _, x in rows if x is not None])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(label: str, cmd: list[str], out: Path, services: list[subprocess.Popen],
            asked: int, env: dict[str, str] | None = None) -> None:
    """Run `cmd` (an envhub run writing to `out`) to its end while sampling it and `services`;
    print one block."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    peak = {p.pid: (0, 0) for p in [proc, *services]}
    while proc.poll() is None:
        for pid, (rss0, fds0) in peak.items():
            rss, fds = sample(pid)
            peak[pid] = (max(rss0, rss), max(fds0, fds))
        time.sleep(0.2)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"envhub run exited {proc.returncode}:\n{proc.stderr.read()[-2000:]}")
    statuses: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    where: collections.Counter[str] = collections.Counter()
    for f in (out / "rollouts").glob("*.json"):
        rec = json.loads(f.read_text())
        statuses[rec["status"]] += 1
        where[rec.get("node", {}).get("service", "run")] += 1
        if rec["status"] != "done":
            reasons[str(rec.get("reason"))[:160]] += 1
    total = sum(statuses.values())
    print(f"{label}: rollouts {total} (asked {asked}), concurrency {asked}")
    print(f"  statuses: {dict(statuses)}; ran in: {sorted(where.values(), reverse=True)}")
    for reason, n in reasons.most_common(5):
        print(f"    {n} x {reason}")
    print(f"  wall {wall:.1f} s: {total / wall * 60:.0f} rollouts/min")
    print(f"  most sessions open at once: {most_open(out / 'pool.db')}")
    rss, fds = peak[proc.pid]
    print(f"  run: peak RSS {rss / 1024:.0f} MiB, peak open file descriptors {fds}")
    for p in services:
        rss, fds = peak[p.pid]
        print(f"  service {p.pid}: peak RSS {rss / 1024:.0f} MiB, peak open file descriptors "
              f"{fds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--k", type=int, default=5, help="samples per task (group size; arith has "
                    "224 tasks, so 1,000 rollouts need k >= 5)")
    ap.add_argument("--services", type=int, default=2, help="task services for the second "
                    "measurement (0: skip it)")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="envhub-bench-inflight-"))
    tasks = a.rollouts // a.k
    asked = tasks * a.k
    base = [sys.executable, "-m", "envhub", "run", "--model", "zero", "-n", str(tasks),
            "-k", str(a.k), "-c", str(asked), "-q"]
    measure("one process", [*base, "arith", "--out", str(root / "one")], root / "one", [],
            asked)
    if not a.services:
        return
    port = free_port()
    capacity = -(-asked // a.services)
    token = {"ENVHUB_SERVICES_TOKEN": "bench-inflight-services-token"}
    services = [subprocess.Popen([sys.executable, "-m", "envhub", "serve", "arith",
                                  "--capacity", str(capacity), "--orchestrator",
                                  f"http://127.0.0.1:{port}"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env={**os.environ, **token})
                for _ in range(a.services)]
    try:
        measure(f"{a.services} task services", [*base, "service:arith", "--services",
                                                 f"127.0.0.1:{port}", "--out",
                                                 str(root / "services")],
                root / "services", services, asked, token)
    finally:
        for p in services:
            p.terminate()
            p.wait(timeout=60)


if __name__ == "__main__":
    main()
