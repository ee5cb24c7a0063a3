"""Validation through the real grader: gold patch resolved 3/3, empty patch 0/3, in time."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox
from envhub.envs.swe.grading import grade
from envhub.envs.swe.repo import build_repo
from envhub.envs.swe.task import SWETask

RUNS = 3
MAX_SECONDS = 60.0


@dataclass
class Validation:
    instance_id: str
    gold: list[bool] = field(default_factory=list)
    empty: list[bool] = field(default_factory=list)
    env_failures: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (all(self.gold) and len(self.gold) == RUNS and not any(self.empty)
                and len(self.empty) == RUNS and not self.env_failures
                and max(self.seconds, default=0) < MAX_SECONDS)


def pristine_opener(task: SWETask, package_root: Path, kind: str, spec: SandboxSpec,
                    run_id: str):
    async def open_pristine() -> Sandbox:
        sandbox = await open_sandbox(kind, spec, run_id=run_id)  # type: ignore[arg-type]
        try:
            await build_repo(sandbox, task, package_root)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox
    return open_pristine


async def validate_task(task: SWETask, package_root: Path, kind: str,
                        spec: SandboxSpec | None = None) -> Validation:
    spec = spec or SandboxSpec()
    opener = pristine_opener(task, package_root, kind, spec, f"validate-{task.instance_id[:20]}")
    result = Validation(task.instance_id)
    for patch, record in [(task.patch, result.gold), ("", result.empty)]:
        for _ in range(RUNS):
            start = time.monotonic()
            verdict = await grade(task, patch, opener)
            result.seconds.append(round(time.monotonic() - start, 2))
            if verdict.env_failure:
                result.env_failures.append(verdict.env_failure)
            record.append(verdict.resolved)
    return result


def validate_all(tasks: list[SWETask], package_root: Path, kind: str,
                 log=print) -> list[Validation]:
    async def run() -> list[Validation]:
        out = []
        for task in tasks:
            v = await validate_task(task, package_root, kind)
            log(f"  {'ok ' if v.ok else 'BAD'} {task.instance_id}: gold {sum(v.gold)}/{RUNS} "
                f"empty {sum(v.empty)}/{RUNS} max {max(v.seconds, default=0):.1f}s"
                + (f" env_failure: {v.env_failures[0]}" if v.env_failures else ""))
            out.append(v)
        return out
    return asyncio.run(run())
