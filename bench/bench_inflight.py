"""Many rollouts in flight in one orchestrator process (issue 26): the real `envhub run` on arith
with the in-process gateway on the zero-work backend (instant completions), the environment's
in-memory sandbox and the tool-calling agent, `--concurrency` as large as the rollout count.
The work per rollout is the orchestrator's and the gateway's own: a session opened, one model
call, verification, rewards posted, the session closed.

Measured from outside the process (sampled every 0.2 s from /proc): peak RSS and peak open
file descriptors. From its results: rollouts per minute (wall clock of the whole command) and
every rollout's status, with the reasons of any that are not done. From its pool: the most
sessions open at once (a session is open from its rollout's start until its group is scored).

    .venv/bin/python bench/bench_inflight.py [--rollouts 1000] [--k 5]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--k", type=int, default=5, help="samples per task (group size; arith has "
                    "224 tasks, so 1,000 rollouts need k >= 5)")
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="envhub-bench-inflight-")) / "run"
    tasks = a.rollouts // a.k
    cmd = [sys.executable, "-m", "envhub", "run", "arith", "--model", "zero", "-n", str(tasks),
           "-k", str(a.k), "-c", str(tasks * a.k), "-q", "--out", str(out)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak_rss = peak_fds = 0
    while proc.poll() is None:
        rss, fds = sample(proc.pid)
        peak_rss, peak_fds = max(peak_rss, rss), max(peak_fds, fds)
        time.sleep(0.2)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"envhub run exited {proc.returncode}:\n{proc.stderr.read()[-2000:]}")
    statuses: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    for f in (out / "rollouts").glob("*.json"):
        rec = json.loads(f.read_text())
        statuses[rec["status"]] += 1
        if rec["status"] != "done":
            reasons[str(rec.get("reason"))[:160]] += 1
    total = sum(statuses.values())
    print(f"rollouts {total} (asked {tasks * a.k}), concurrency {tasks * a.k}, one process")
    print(f"  statuses: {dict(statuses)}")
    for reason, n in reasons.most_common(5):
        print(f"    {n} x {reason}")
    print(f"  wall {wall:.1f} s: {total / wall * 60:.0f} rollouts/min")
    print(f"  most sessions open at once: {most_open(out / 'pool.db')}")
    print(f"  peak RSS {peak_rss / 1024:.0f} MiB, peak open file descriptors {peak_fds}")


if __name__ == "__main__":
    main()
