"""`envhub audit` wall time per environment, measured one after another in one run.

    python bench/bench_audit.py                                   # arith, swe-task (local, docker)
    python bench/bench_audit.py arith swe-task:docker terminal-task slides webtask -t 1 -j 2

Each ENV[:KIND] runs `envhub audit ENV -t N [--sandbox KIND]` as a user would (a subprocess, its
own in-process gateways) and prints its wall time, its exit status (0 clean, 1 flagged), how
many rows it ran and which were flagged. Wall time covers the whole battery: the no-op alone
first, then the oracle and the cheats `-j` at a time, each a full `envhub run` with grading.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = ["arith", "swe-task:local", "swe-task:docker"]


def audit_once(target: str, tasks: int, parallel: int, scratch: Path) -> dict:
    env, _, kind = target.partition(":")
    out = scratch / target.replace(":", "-").replace("/", "_")
    report = out.with_suffix(".json")
    args = [sys.executable, "-m", "envhub", "audit", env, "-t", str(tasks), "-j", str(parallel),
            "--out", str(out), "--json", str(report)] + (["--sandbox", kind] if kind else [])
    started = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    data = json.loads(report.read_text()) if report.is_file() else {"rows": []}
    flagged = [f"{r['cheat']}: {r['verdict']}" for r in data["rows"] if r["verdict"] != "ok"]
    error = "" if data["rows"] else (proc.stderr.strip().splitlines() or ["?"])[-1]
    return {"target": target, "wall_s": wall, "exit": proc.returncode,
            "rows": len(data["rows"]), "flagged": flagged, "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", default=DEFAULT, help="ENV or ENV:KIND")
    parser.add_argument("-t", "--tasks", type=int, default=1)
    parser.add_argument("-j", "--parallel", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envhub-bench-audit-") as tmp:
        print(f"{'environment':24} {'wall s':>8} {'exit':>4} {'rows':>4}  flagged")
        for target in args.targets:
            r = audit_once(target, args.tasks, args.parallel, Path(tmp))
            note = "; ".join(r["flagged"]) or r["error"] or "-"
            print(f"{r['target']:24} {r['wall_s']:8.1f} {r['exit']:4d} {r['rows']:4d}  {note}",
                  flush=True)


if __name__ == "__main__":
    main()
