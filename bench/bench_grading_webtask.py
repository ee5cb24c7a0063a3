"""Grading time per rollout of `webtask`, side by side in one run. Per task and sandbox kind:
the oracle's browser-tool calls run in the rollout's sandbox, then

  verify (now)   the environment's own `verify`: a fresh sandbox, a fresh app, the rollout's
                 recorded tool calls replayed in one Chromium, the state it leaves checked;
  read (old)     what envhub did before: the agent's own `.webapp/state.json` read and checked
                 (which a command agent could simply write);
  no calls       `verify` of a rollout that made no tool call (a command agent): graded on the
                 task's initial state, no sandbox opened;
  one live call  for scale: one read_page tool call in the rollout's sandbox (one driver run,
                 a Chromium start), what every tool call of the agent costs.

One row per task and kind, in bench_grading.py's table (its part `webtask`), or alone:

    python bench/bench_grading_webtask.py --repeat 3 [--kinds local,docker]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from envhub.envs.builtin.webtask.env import STATE_FILE, check_state
from envhub.envs.environment import RunContext, Task
from envhub.envs.loader import load_env
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox

sys.path.insert(0, str(Path(__file__).parent))
from bench_grading import Row, print_table  # noqa: E402 - a sibling script, not a package

COLUMNS = ("verify (now)", "read (old)", "no calls", "one live call")


async def _once(kind: str, task: Task, scratch: Path) -> tuple[dict, dict]:
    loaded = load_env("webtask")
    env = loaded.env
    opened: list[Sandbox] = []

    async def opener(spec: SandboxSpec) -> Sandbox:
        box = await open_sandbox(kind, spec, run_id="bench-grading", package_root=loaded.folder)
        opened.append(box)
        return box

    ctx = RunContext(run_id="bench-grading", sandbox_kind=kind, open_sandbox=opener,
                     scratch=scratch)
    try:
        idle = await env.setup(task, ctx)
        t0 = time.monotonic()
        untouched = await env.verify(task, idle, ctx)
        t1 = time.monotonic()
        sandbox = await env.setup(task, ctx)
        await env.solve(task, sandbox, ctx)
        await sandbox.end_processes()
        t2 = time.monotonic()
        verdict = await env.verify(task, sandbox, ctx)
        t3 = time.monotonic()
        state = json.loads(await sandbox.read_file(STATE_FILE))
        old_ok = not check_state(state, task.data["expected"])
        t4 = time.monotonic()
        live = await env.call_tool(task, "read_page", "{}", sandbox, {})
        t5 = time.monotonic()
    finally:
        while opened:
            await opened.pop().close()
    seconds = {"verify (now)": t3 - t2, "read (old)": t4 - t3, "no calls": t1 - t0,
               "one live call": t5 - t4}
    # '!' under "no calls": a rollout without calls resolved
    ok = {"verify (now)": verdict.resolved, "read (old)": old_ok,
          "no calls": not untouched.resolved, "one live call": not live.is_error}
    return seconds, ok


def available(kind: str) -> bool:
    import shutil

    if kind == "local":
        return shutil.which("bwrap") is not None
    from envhub.envs.sandbox.engine import docker_reachable

    return bool(docker_reachable())


def part_webtask(args: argparse.Namespace) -> list[Row]:
    tasks = load_env("webtask").env.load_tasks()
    if args.tasks:
        tasks = [t for t in tasks if t.id in set(args.tasks.split(","))]
    scratch = Path(tempfile.mkdtemp(prefix="envhub-bench-grading-"))
    rows = []
    for kind in [k for k in getattr(args, "kinds", "local,docker").split(",") if available(k)]:
        for task in tasks:
            samples = [asyncio.run(_once(kind, task, scratch)) for _ in range(args.repeat)]
            row = Row(f"{kind}/{task.id}")
            for column in COLUMNS:
                row.seconds[column] = statistics.median(s[0][column] for s in samples)
                row.ok[column] = all(s[1][column] for s in samples)
            print(f"  {row.task}: " + ", ".join(f"{c} {v:.2f}s" for c, v in row.seconds.items()),
                  file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default="local,docker", help="sandbox kinds, comma list")
    parser.add_argument("--tasks", default="", help="comma list of task ids (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="rollouts per task (median)")
    print_table("webtask", part_webtask(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
