"""`terminal-task`: Harbor task folders as an envhub environment.

setup: the task's environment/Dockerfile built on the envhub base (cached by content) and
started with the task's cpus / memory / network; solve: solution/solve.sh; verify: tests/
uploaded after the agent finished, reward read from /logs/verifier (envhub.envs.harbor).
"""

from __future__ import annotations

from pathlib import Path

from envhub.envs.environment import EnvFailure, RunContext, Task, Verdict
from envhub.envs.harbor import HarborTask, load_harbor_tasks, run_solution, run_verifier
from envhub.envs.manifest import Manifest
from envhub.envs.sandbox.base import Sandbox

NOTE = "\n\n(Your working directory is {workdir}.)\n"


class TerminalTaskEnv:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self.tasks_root = self.folder / str(manifest.metadata.get("tasks_dir", "tasks"))
        self._by_name: dict[str, HarborTask] = {}

    def load_tasks(self) -> list[Task]:
        tasks = []
        for harbor in load_harbor_tasks(self.tasks_root):
            self._by_name[harbor.name] = harbor
            tasks.append(Task(
                id=harbor.name,
                instruction=harbor.instruction.rstrip() + NOTE.format(workdir=harbor.workdir),
                data={"folder": str(harbor.folder.relative_to(self.folder)),
                      "metadata": harbor.config.metadata,
                      "agent_timeout_sec": harbor.config.agent.timeout_sec,
                      "verifier_timeout_sec": harbor.config.verifier.timeout_sec}))
        return tasks

    def harbor_task(self, task: Task) -> HarborTask:
        if not self._by_name:
            self.load_tasks()
        if task.id not in self._by_name:
            raise EnvFailure(f"unknown terminal task {task.id!r}")
        return self._by_name[task.id]

    def tools(self, task: Task) -> list[str]:
        return list(self.manifest.tools)

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        harbor = self.harbor_task(task)
        if ctx.sandbox_kind not in ("docker", "auto"):
            raise EnvFailure(f"terminal-task builds each task's environment/Dockerfile, so it "
                             f"needs the docker sandbox (got '{ctx.sandbox_kind}'): run with "
                             "--sandbox docker")
        env = harbor.config.environment
        spec = self.manifest.sandbox.model_copy(update={
            "dockerfile": None if env.docker_image else
            str(harbor.dockerfile.relative_to(self.folder)),
            "image": env.docker_image, "cpus": env.cpus, "memory_mb": env.memory_mb,
            "network": env.allow_internet, "setup_timeout_s": env.build_timeout_sec,
        })
        return await ctx.open_sandbox(spec)

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        await run_solution(self.harbor_task(task), sandbox)

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        return await run_verifier(self.harbor_task(task), sandbox)
