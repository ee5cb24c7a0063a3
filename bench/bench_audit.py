"""`envhub audit` wall time per environment, measured one after another in one run.

    python bench/bench_audit.py                                   # arith, swe-task (local, docker)
    python bench/bench_audit.py arith swe-task:docker terminal-task slides webtask -t 1 -j 2
    python bench/bench_audit.py --all                             # every target of the CI test

`--all` runs what tests/envs/test_audit.py::test_audit_passes_on_every_builtin audits: every
built-in in each sandbox kind it supports, the Harbor docs' dataset (all its tasks), a bare
Harbor task, a terminal-bench 1 task and the SWE-bench row (its image built and tagged here,
removed afterwards), with the same task counts. A target may also be a folder or rows file.

Each ENV[:KIND] runs `envhub audit ENV -t N [--sandbox KIND]` as a user would (a subprocess, its
own in-process gateways) and prints its wall time, its exit status (0 clean, 1 flagged), how
many rows it ran and which were flagged. Wall time covers the whole battery: the no-op alone
first, then the oracle and the cheats `-j` at a time, each a full `envhub run` with grading.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = ["arith", "swe-task:local", "swe-task:docker"]


def audit_once(target: str, tasks: int, parallel: int, scratch: Path, ref: str = "") -> dict:
    """One `envhub audit`; `ref` is what it audits when `target` is only a label."""
    env, _, kind = target.partition(":")
    env = ref or env
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


def all_targets(scratch: Path, stack: contextlib.ExitStack) -> list[tuple[str, str, int]]:
    """(label ENV:KIND, what to audit, tasks) for every case of the CI test, folders written
    and the SWE-bench image built as the test does (its helpers, so both audit the same)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` importable
    from tests.envs import test_audit as t

    out = []
    for name, kind, tasks, _ in t.ALL_TARGETS:
        scratch_one = scratch / f"target-{name}-{kind}"
        scratch_one.mkdir(parents=True)
        out.append((f"{name}:{kind}", t._target(name, scratch_one, stack), tasks))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", default=None, help="ENV or ENV:KIND")
    parser.add_argument("--all", action="store_true", help="every target of the CI test")
    parser.add_argument("-t", "--tasks", type=int, default=1)
    parser.add_argument("-j", "--parallel", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envhub-bench-audit-") as tmp, \
            contextlib.ExitStack() as stack:
        plan = (all_targets(Path(tmp), stack) if args.all else
                [(t, "", args.tasks) for t in args.targets or DEFAULT])
        print(f"{'environment':28} {'tasks':>5} {'wall s':>8} {'exit':>4} {'rows':>4}  flagged")
        for target, ref, tasks in plan:
            r = audit_once(target, tasks, args.parallel, Path(tmp), ref)
            note = "; ".join(r["flagged"]) or r["error"] or "-"
            print(f"{r['target']:28} {tasks:5d} {r['wall_s']:8.1f} {r['exit']:4d} "
                  f"{r['rows']:4d}  {note}", flush=True)


if __name__ == "__main__":
    main()
