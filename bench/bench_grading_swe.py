"""swe-task grading time per rollout, this tree against an earlier revision, in one run.

    python bench/bench_grading_swe.py --before 4a369cc              # 3 tasks x 3 rounds, local
    python bench/bench_grading_swe.py --before 4a369cc --kinds local,docker --rounds 5

The earlier revision is checked out into a temporary git worktree; each round grades the gold
patch of every task once with each tree's own `grade` (a child process per tree and round, its
imports from that tree), interleaved so that drift on a shared machine hits both alike. Prints
the median seconds per rollout per tree and kind, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["toolz-1.2.0__get_in__wrong_default", "cachetools-8.0.0__rr_cache__wrong_default",
         "inflection-0.5.1__camelize__dropped_branch"]
CHILD = """
import asyncio, json, sys, time
from pathlib import Path
from envhub.envs.manifest import SandboxSpec
from envhub.envs.swe.construct.validate import pristine_opener
from envhub.envs.swe.grading import grade
from envhub.envs.swe.task import load_swe_tasks
data = Path("envs/builtin/swe_task/data")
tasks = {t.instance_id: t for t in load_swe_tasks(data / "tasks.jsonl")}
out = []
for task_id in sys.argv[2:]:
    task = tasks[task_id]
    opener = pristine_opener(task, data, sys.argv[1], SandboxSpec(), "bench-swe")
    start = time.monotonic()
    verdict = asyncio.run(grade(task, task.patch, opener))
    out.append((time.monotonic() - start, bool(verdict.resolved)))
print(json.dumps(out))
"""


def timed(tree: Path, kind: str) -> list[tuple[float, bool]]:
    done = subprocess.run([sys.executable, "-c", CHILD, kind, *TASKS], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                          text=True, check=True)
    return [tuple(x) for x in json.loads(done.stdout.strip().splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default="local")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envhub-bench-before-") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(old), args.before],
                       cwd=ROOT, check=True)
        try:
            for kind in args.kinds.split(","):
                times: dict[str, list[float]] = {"before": [], "now": []}
                unresolved = 0
                for _ in range(args.rounds):
                    for name, tree in (("before", old), ("now", ROOT)):
                        for seconds, resolved in timed(tree, kind):
                            times[name].append(seconds)
                            unresolved += not resolved
                b, n = (statistics.median(times[k]) for k in ("before", "now"))
                print(f"{kind:7s} grading s per rollout (median of {len(times['now'])}): "
                      f"before {b:.2f}  now {n:.2f}  now/before {n / b:.2f}x"
                      f"{f'  ({unresolved} unresolved!)' if unresolved else ''}")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT,
                           check=False)


if __name__ == "__main__":
    main()
