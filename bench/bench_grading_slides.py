"""Grading time per rollout of `slides`: the oracle's deck written to the rollout's sandbox, then
the environment's own `verify` timed (a fresh sandbox, one Chromium, every slide rendered,
measured, screenshotted and scored). One row per task and sandbox kind, in bench_grading.py's
table (its part `slides`), or alone:

    python bench/bench_grading_slides.py --repeat 5 [--kinds local,docker]
    python bench/bench_grading.py --env slides --repeat 5

Measured on the shared 2-core machine (load 7-14), quarterly-update ... square-poster, local,
the median of per-task medians, old and new runs interleaved (the old code from a `git archive`
of the commit before, put first on PYTHONPATH): before (computed styles and innerText) 2.1-3.3 s
per rollout (median 2.5), after (plus three clipped screenshots per slide with required phrases)
2.5-3.1 s (median 2.9); in the browser the screenshots and their pixels take 130-490 ms of a
slide's 430-820 ms (render_ms, ink_ms).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from envhub.envs.environment import RunContext, Task
from envhub.envs.loader import load_env
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox

sys.path.insert(0, str(Path(__file__).parent))
from bench_grading import Row, print_table  # noqa: E402 - a sibling script, not a package


async def _verify_once(kind: str, task: Task, scratch: Path) -> tuple[float, bool]:
    loaded = load_env("slides")
    opened: list[Sandbox] = []

    async def opener(spec: SandboxSpec) -> Sandbox:
        box = await open_sandbox(kind, spec, run_id="bench-grading",
                                 package_root=loaded.folder)
        opened.append(box)
        return box

    ctx = RunContext(run_id="bench-grading", sandbox_kind=kind, open_sandbox=opener,
                     scratch=scratch)
    try:
        sandbox = await loaded.env.setup(task, ctx)
        await loaded.env.solve(task, sandbox, ctx)
        t0 = asyncio.get_running_loop().time()
        verdict = await loaded.env.verify(task, sandbox, ctx)
        seconds = asyncio.get_running_loop().time() - t0
    finally:
        while opened:
            await opened.pop().close()
    return seconds, verdict.resolved and verdict.env_failure is None


def part_slides(args: argparse.Namespace) -> list[Row]:
    """Per task, the median verify seconds of `args.repeat` oracle rollouts, one column per
    sandbox kind in `args.kinds` (default local)."""
    tasks = load_env("slides").env.load_tasks()
    if getattr(args, "tasks", ""):
        tasks = [t for t in tasks if t.id in set(args.tasks.split(","))]
    kinds = (getattr(args, "kinds", None) or "local").split(",")
    scratch = Path(tempfile.mkdtemp(prefix="envhub-bench-slides-"))
    rows = []
    for task in tasks:
        row = Row(task.id)
        for kind in kinds:
            samples = [asyncio.run(_verify_once(kind, task, scratch))
                       for _ in range(args.repeat)]
            row.seconds[f"verify {kind}"] = statistics.median(s for s, _ in samples)
            row.ok[f"verify {kind}"] = all(ok for _, ok in samples)
        print(f"  {task.id}: " + ", ".join(f"{c} {v:.2f}s" for c, v in row.seconds.items()),
              file=sys.stderr, flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tasks", default="")
    parser.add_argument("--kinds", default="local")
    print_table("slides", part_slides(parser.parse_args()))
