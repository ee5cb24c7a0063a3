"""How many versions one registry audit worker verifies per hour, on the built-in environments.

A real `envhub registry serve` on a scratch data folder; the built-in environments (arith, the
`envhub init` template, search by default) published to it with `--no-audit`, so each waits in
the registry's queue; then one `envhub registry worker --once` drains the queue, jailed, and
again `--unjailed` on a second registry holding the same packages, side by side in one run.
Prints each version's audit time and verdict, versions per hour per worker, and the jail's
cost as the ratio of the two.

    .venv/bin/python bench/bench_audit_queue.py [--envs arith,template,search] [--tasks 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
ENVHUB = [sys.executable, "-m", "envhub"]


def cli(*args: str, home: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*ENVHUB, *args], capture_output=True, text=True, check=False,
                         env={**os.environ, "ENVHUB_HOME": str(home)})
    if check and out.returncode != 0:
        raise SystemExit(f"envhub {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return out


def package(name: str, work: Path, home: Path) -> Path:
    """The folder of a built-in environment (a copy), or a fresh `envhub init` template."""
    if name == "template":
        cli("init", str(work / "template"), home=home)
        return work / "template"
    from envhub.envs.loader import load_env

    return Path(shutil.copytree(load_env(name).folder, work / name,
                                ignore=shutil.ignore_patterns("__pycache__")))


def registry(data: Path, home: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = cli("registry", "token", "create", "--owner", "bench", "--data", str(data),
                home=home).stdout.strip()
    proc = subprocess.Popen([*ENVHUB, "registry", "serve", "--data", str(data), "--port",
                             str(port)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                return proc, url, token
        except httpx.TransportError:
            time.sleep(0.2)
    raise SystemExit("the registry did not start")


def drain(data: Path, tasks: int, unjailed: bool, home: Path) -> tuple[float, list[tuple]]:
    """One worker until the queue is empty: (its wall seconds, per version: name, seconds,
    state, status)."""
    t0 = time.time()
    cli("registry", "worker", "--data", str(data), "--once", "--tasks", str(tasks),
        *(["--unjailed"] if unjailed else []), home=home)
    wall = time.time() - t0
    with sqlite3.connect(data / "index.db") as db:
        jobs = db.execute("SELECT name, finished_at, state, summary FROM audit_jobs ORDER BY "
                          "finished_at").fetchall()
    rows, last = [], t0
    for name, finished, state, summary in jobs:
        status = json.loads(summary)["status"] if summary else "-"
        rows.append((name, (finished or last) - last, state, status))
        last = finished or last
    return wall, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default="arith,template,search")
    parser.add_argument("--tasks", type=int, default=1, help="tasks per cheat")
    args = parser.parse_args()
    names = [n.strip() for n in args.envs.split(",") if n.strip()]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-audit-queue-") as tmp:
        work, home = Path(tmp), Path(tmp) / "home"
        folders = [package(n, work, home) for n in names]
        for jailed in (True, False):
            data = work / ("jailed" if jailed else "unjailed")
            proc, url, token = registry(data, home)
            try:
                for folder in folders:
                    cli("publish", str(folder), "--registry", url, "--token", token,
                        "--owner", "bench", "--no-audit", home=home)
                results[jailed] = drain(data, args.tasks, not jailed, home)
            finally:
                proc.terminate()
                proc.wait(30)
    print(f"{'version':<12} {'jailed s':>9} {'unjailed s':>11} {'verdict':>10}")
    unjailed = {r[0]: r for r in results[False][1]}
    for name, seconds, state, status in results[True][1]:
        other = unjailed.get(name, (name, float("nan"), "", ""))
        print(f"{name:<12} {seconds:>9.1f} {other[1]:>11.1f} "
              f"{status if state == 'done' else state:>10}")
    for jailed in (True, False):
        wall, rows = results[jailed]
        print(f"{'jailed' if jailed else 'unjailed':<9} {len(rows)} versions in {wall:.1f} s: "
              f"{3600 * len(rows) / wall:.1f} versions/hour/worker")
    print(f"jail / unjailed wall: {results[True][0] / results[False][0]:.2f}x")


if __name__ == "__main__":
    main()
