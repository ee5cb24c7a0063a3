"""`swe-task`: the Environment entrypoint over `envhub.envs.swe`.

setup: a sandbox with the repository at `repo_dir`, one commit, nothing else reachable.
solve (oracle): the gold patch applied in the agent's sandbox.
verify: the agent's diff, graded in a fresh pristine sandbox (`envhub.envs.swe.grading`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from envhub.envs.environment import EnvFailure, RunContext, Task, Verdict
from envhub.envs.errors import EnvLoadError
from envhub.envs.loader import task_rows
from envhub.envs.manifest import Manifest, SandboxSpec
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.swe import swebench
from envhub.envs.swe.grading import apply_patch, grade
from envhub.envs.swe.repo import agent_diff, build_repo, cut_history, pytest_env
from envhub.envs.swe.task import SWETask, TaskFileError, parse_task, refuse_swesmith
from envhub.envs.swe.task_image import task_image

INSTRUCTION = """{statement}
---
The repository is at {repo_dir} (a git checkout of the commit to fix). Change the source code
so that the problem above is fixed. Tests that check the fix exist but are hidden from you;
changes to test files, conftest.py or test configuration are discarded before grading, and only
changes inside {repo_dir} count. If `python3 -m pytest` is missing in your shell, run
`PYTHONPATH=/workspace/.envhub/pylib python3 -m pytest`.{setup} When you are done, submit."""
SETUP_HINT = (" The project's own environment (its python and packages) is set up by "
              "`{}`; start each command with it.")


class SWETaskEnv:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        # Snapshots (`source_archive`) are relative to the folder of the task file.
        self.data_root = (self.folder / (manifest.tasks.path or "tasks.jsonl")).parent
        self._tasks: dict[str, SWETask] = {}
        self._bases: dict[str, str] = {}  # sandbox id -> base commit the agent started from

    def load_tasks(self) -> list[Task]:
        rows = task_rows(self.folder, self.manifest.tasks)
        where = f"{self.folder}/{self.manifest.tasks.path or self.manifest.tasks.dataset}"
        parsed = []
        try:
            for i, row in enumerate(rows):
                refuse_swesmith(row, f"{where} row {i + 1}")
                parsed.append(parse_task(row, f"{where} row {i + 1}"))
        except TaskFileError as e:
            raise EnvLoadError(str(e)) from None
        # Rows in SWE-bench's own schema run on SWE-bench's images, found by their names.
        parsed = swebench.resolve(parsed, where)
        tasks = []
        for swe in parsed:
            self._tasks[swe.instance_id] = swe
            tasks.append(Task(id=swe.instance_id, data=swe.model_dump(mode="json"),
                              instruction=INSTRUCTION.format(
                statement=swe.problem_statement.rstrip(), repo_dir=swe.repo_dir,
                setup=SETUP_HINT.format(swe.shell_setup) if swe.shell_setup else "")))
        return tasks

    def verify_budget_s(self, task: Task) -> float:
        """The grading run, its retry in a fresh sandbox and the pristine control, each up to
        the task's timeout, and the sandboxes they open (environment.GradingBudget)."""
        return 3 * self.swe_task(task).timeout + self.manifest.sandbox.setup_timeout_s

    def swe_task(self, task: Task) -> SWETask:
        if task.id not in self._tasks:
            self._tasks[task.id] = parse_task(task.data, f"task {task.id}")
        return self._tasks[task.id]

    def tools(self, task: Task) -> list[str]:
        return list(self.manifest.tools)

    async def _spec(self, swe: SWETask, ctx: RunContext) -> tuple[SandboxSpec, bool]:
        """(spec, prebuilt): a prebuilt image already holds the repository at base_commit."""
        update: dict = {"exec_timeout_s": max(self.manifest.sandbox.exec_timeout_s, swe.timeout)}
        if swe.image:
            return self.manifest.sandbox.model_copy(update={**update, "image": swe.image}), True
        if (ctx.sandbox_kind == "docker" and swe.source_archive
                and self.manifest.metadata.get("prebuilt_images", True)):
            tag = (await asyncio.to_thread(task_image, swe, self.data_root)).tag
            return self.manifest.sandbox.model_copy(update={**update, "image": tag}), True
        return self.manifest.sandbox.model_copy(update=update), False

    async def _pristine(self, swe: SWETask, ctx: RunContext) -> tuple[Sandbox, str]:
        spec, prebuilt = await self._spec(swe, ctx)
        sandbox = await ctx.open_sandbox(spec)
        try:
            if not prebuilt:
                return sandbox, await build_repo(sandbox, swe, self.data_root)
            head = await sandbox.exec(f"git -C {swe.repo_dir} -c safe.directory='*' "
                                      "rev-parse HEAD", timeout=60)
            # Our snapshots and SWE-bench's images both hold the repository at base_commit.
            exact = swe.source_archive or swe.metadata.get("swebench_image")
            if head.exit_code != 0 or (exact and head.stdout.strip() != swe.base_commit):
                raise EnvFailure(f"{swe.instance_id}: image {spec.image} does not hold the "
                                 f"repository at {swe.base_commit} in {swe.repo_dir} "
                                 f"(exit {head.exit_code}: "
                                 f"{head.stdout.strip() or head.stderr.strip()[-300:]})")
            return sandbox, head.stdout.strip()
        except BaseException:
            await sandbox.close()
            raise

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        swe = self.swe_task(task)
        sandbox, base = await self._pristine(swe, ctx)
        try:
            if swe.image:  # a foreign image may carry the whole (future) history: cut it
                base = await cut_history(sandbox, swe)
            await pytest_env(sandbox, swe)  # agents can run pytest too (local: host's pytest)
        except BaseException:
            await sandbox.close()
            raise
        self._bases[sandbox.id] = base
        return sandbox

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        swe = self.swe_task(task)
        ok, error = await apply_patch(sandbox, swe.repo_dir, swe.patch, "gold")
        if not ok:
            raise EnvFailure(f"{swe.instance_id}: the gold patch does not apply: {error}")

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        swe = self.swe_task(task)
        base = self._bases.pop(sandbox.id, swe.base_commit)
        diff, problem = await agent_diff(sandbox, swe, base)

        async def open_pristine() -> Sandbox:
            return (await self._pristine(swe, ctx))[0]

        verdict = await grade(swe, diff, open_pristine)
        if problem:
            verdict.info.setdefault("problems", []).insert(0, problem)
        return verdict
