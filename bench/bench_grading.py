"""Grading time per rollout, measured side by side in one run.

    python bench/bench_grading.py --env terminal-task            # every bundled task, once
    python bench/bench_grading.py --env terminal-task --repeat 3 --tasks word-frequency

terminal-task: per task, the oracle's solve.sh runs in the agent's container, then the
environment's own `verify` is timed (today: a fresh grader container from the task image, the
declared artifacts copied into it, tests/test.sh run there), then the old way on the same
container for comparison: tests/ uploaded into the agent's own container and test.sh run
there ("in-place", what envhub did before grading moved out of the agent's toolchain).
Prints one row per task and the medians; a '!' marks a verdict that did not resolve.

Other environments may add a part: a function `part_<env>(args) -> list[Row]` and an entry in
PARTS; the table printer is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from envhub.envs.environment import RunContext, Task
from envhub.envs.loader import load_env
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox


@dataclass
class Row:
    """One task's measurements: column name -> seconds (median over repeats), and whether the
    gold solution resolved under each."""

    task: str
    seconds: dict[str, float] = field(default_factory=dict)
    ok: dict[str, bool] = field(default_factory=dict)


def print_table(env: str, rows: list[Row]) -> None:
    columns = list(dict.fromkeys(c for r in rows for c in r.seconds))
    print(f"\n== {env}: grading seconds per rollout")
    print(f"{'task':40} " + " ".join(f"{c:>16}" for c in columns))
    for r in rows:
        print(f"{r.task[:40]:40} " + " ".join(
            f"{r.seconds[c]:15.2f}{' ' if r.ok.get(c, True) else '!'}" for c in columns))
    medians = [statistics.median(r.seconds[c] for r in rows) for c in columns]
    print(f"{'median':40} " + " ".join(f"{m:15.2f} " for m in medians))
    if len(columns) >= 2 and medians[1] > 0:
        print(f"ratio {columns[0]} / {columns[1]} (medians): {medians[0] / medians[1]:.2f}x")


async def _in_place(harbor, sandbox: Sandbox) -> bool:  # noqa: ANN001 - a HarborTask
    """The old grading, for comparison: tests/ into the agent's own container, test.sh there."""
    await sandbox.end_processes()
    await sandbox.exec("rm -rf /tests /logs/verifier && mkdir -p /logs/verifier", timeout=60,
                       cwd="/")
    await sandbox.upload(str(harbor.tests_dir), "/tests")
    await sandbox.exec("bash /tests/test.sh", timeout=harbor.config.verifier.timeout_sec,
                       cwd=harbor.workdir)
    await sandbox.end_processes()
    return (await sandbox.read_file("/logs/verifier/reward.txt")).strip() == b"1"


async def _terminal_once(loaded, task: Task, scratch: Path) -> tuple[dict, dict]:  # noqa: ANN001
    opened: list[Sandbox] = []

    async def opener(spec: SandboxSpec) -> Sandbox:
        box = await open_sandbox("docker", spec, run_id="bench-grading",
                                 package_root=loaded.folder)
        opened.append(box)
        return box

    ctx = RunContext(run_id="bench-grading", sandbox_kind="docker", open_sandbox=opener,
                     scratch=scratch)
    env = loaded.env
    try:
        sandbox = await env.setup(task, ctx)
        await env.solve(task, sandbox, ctx)
        await sandbox.end_processes()
        t0 = time.monotonic()
        verdict = await env.verify(task, sandbox, ctx)
        t1 = time.monotonic()
        in_place_ok = await _in_place(env.harbor_task(task), sandbox)
        t2 = time.monotonic()
    finally:
        while opened:
            await opened.pop().close()
    ok = verdict.resolved and verdict.env_failure is None
    return ({"verify (now)": t1 - t0, "in-place (old)": t2 - t1},
            {"verify (now)": ok, "in-place (old)": in_place_ok})


def part_terminal_task(args: argparse.Namespace) -> list[Row]:
    import tempfile

    loaded = load_env("terminal-task")
    tasks = loaded.env.load_tasks()
    if args.tasks:
        wanted = set(args.tasks.split(","))
        tasks = [t for t in tasks if t.id.split("/")[-1] in wanted or t.id in wanted]
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="envhub-bench-grading-"))
    for task in tasks:
        samples = [asyncio.run(_terminal_once(loaded, task, scratch)) for _ in range(args.repeat)]
        row = Row(task.id)
        for column in samples[0][0]:
            row.seconds[column] = statistics.median(s[0][column] for s in samples)
            row.ok[column] = all(s[1][column] for s in samples)
        print(f"  {task.id}: " + ", ".join(f"{c} {v:.2f}s" for c, v in row.seconds.items()),
              file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def part_webtask(args: argparse.Namespace) -> list[Row]:
    """bench_grading_webtask.py's rows (replay in a fresh sandbox vs. the old state-file read)."""
    from bench_grading_webtask import part_webtask as part

    return part(args)


def part_slides(args: argparse.Namespace) -> list[Row]:
    """bench_grading_slides.py's rows (the oracle deck's verify, per sandbox kind)."""
    from bench_grading_slides import part_slides as part

    return part(args)


PARTS: dict[str, Callable[[argparse.Namespace], list[Row]]] = {
    "terminal-task": part_terminal_task,
    "webtask": part_webtask,
    "slides": part_slides,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="terminal-task", help=f"one of {', '.join(PARTS)}")
    parser.add_argument("--tasks", default="", help="comma list of task ids (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="rollouts per task (median)")
    args = parser.parse_args()
    if args.env not in PARTS:
        parser.error(f"--env {args.env}: no such part; have {', '.join(PARTS)}")
    print_table(args.env, PARTS[args.env](args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
