"""What tamper detection costs at grading time, measured side by side in one run.

    python bench/bench_grading_canaries.py                 # 3 tasks x 5 rounds, local + docker
    python bench/bench_grading_canaries.py --rounds 9 --kinds local

Prints, per sandbox kind, the median time to grade the gold patch with the canary tests
planted (as swe-task grades) and without them (`grade(..., with_canaries=False)`, which
nothing else uses), interleaved so that drift on a shared machine hits both alike; and, for
docker, the median cost of one `end_processes` sweep (run after every exec and at the end of
the agent phase).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from envhub.envs.manifest import SandboxSpec
from envhub.envs.swe.construct.validate import pristine_opener
from envhub.envs.swe.grading import grade
from envhub.envs.swe.task import load_swe_tasks

DATA = Path(__file__).resolve().parents[1] / "envs" / "builtin" / "swe_task" / "data"
TASKS = ["toolz-1.2.0__get_in__wrong_default", "cachetools-8.0.0__rr_cache__wrong_default",
         "inflection-0.5.1__camelize__dropped_branch"]


def graded_s(task, kind: str, canaries: bool) -> float:  # noqa: ANN001
    opener = pristine_opener(task, DATA, kind, SandboxSpec(), "bench-canary")
    start = time.monotonic()
    verdict = asyncio.run(grade(task, task.patch, opener, with_canaries=canaries))
    assert verdict.resolved and not verdict.signals, (task.instance_id, verdict.info)
    return time.monotonic() - start


def sweep_s(rounds: int) -> float:
    from envhub.envs.images import ensure_base_image
    from envhub.envs.sandbox.docker import DockerSandbox

    async def go() -> list[float]:
        box = await DockerSandbox.create(SandboxSpec(), ensure_base_image().tag, "bench-canary")
        try:
            out = []
            for _ in range(rounds):
                start = time.monotonic()
                await box.end_processes()
                out.append(time.monotonic() - start)
            return out
        finally:
            await box.close()
    return statistics.median(asyncio.run(go()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kinds", default="local,docker")
    args = parser.parse_args()
    tasks = {t.instance_id: t for t in load_swe_tasks(DATA / "tasks.jsonl")}
    for kind in args.kinds.split(","):
        with_c: list[float] = []
        without: list[float] = []
        for _ in range(args.rounds):
            for task_id in TASKS:
                with_c.append(graded_s(tasks[task_id], kind, True))
                without.append(graded_s(tasks[task_id], kind, False))
        a, b = statistics.median(with_c), statistics.median(without)
        print(f"{kind:7s} grading median over {len(with_c)}: with canaries {a:.3f}s, without "
              f"{b:.3f}s, overhead {a - b:+.3f}s ({(a / b - 1) * 100:+.1f}%)")
        if kind == "docker":
            print(f"docker  end_processes sweep median: {sweep_s(20) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
