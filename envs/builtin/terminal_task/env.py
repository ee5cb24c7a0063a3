"""`terminal-task`: Harbor task folders as an envhub environment.

setup: the task's environment/Dockerfile built on the envhub base (cached by content) and
started with the task's cpus / memory / network; solve: solution/solve.sh; verify: a fresh
container of the same image (the agent never ran in it) receives only the task's declared
artifact paths from the agent's container, then runs tests/test.sh there; the reward is read
from /logs/verifier (envhub.envs.harbor).
"""

from __future__ import annotations

from pathlib import Path

from envhub.envs.environment import EnvFailure, RunContext, Task, Verdict
from envhub.envs.harbor import HarborTask, load_harbor_tasks, run_solution, run_verifier
from envhub.envs.manifest import Manifest, SandboxSpec
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

    def verify_budget_s(self, task: Task) -> float:
        """test.sh, its retry in a fresh grader and the pristine control, each up to the
        verifier's timeout, and the containers they start (environment.GradingBudget)."""
        harbor = self.harbor_task(task)
        return (3 * harbor.config.verifier.timeout_sec
                + 3 * harbor.config.environment.build_timeout_sec)

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
        return await ctx.open_sandbox(self.sandbox_spec(harbor))

    def sandbox_spec(self, harbor: HarborTask) -> SandboxSpec:
        """The task's image and resources: the agent's sandbox and the grader's alike."""
        env = harbor.config.environment
        return self.manifest.sandbox.model_copy(update={
            "dockerfile": None if env.docker_image else
            str(harbor.dockerfile.relative_to(self.folder)),
            "image": env.docker_image, "cpus": env.cpus, "memory_mb": env.memory_mb,
            "network": env.allow_internet, "setup_timeout_s": env.build_timeout_sec,
        })

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        await run_solution(self.harbor_task(task), sandbox)

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        """Graded in a fresh container of the task image (see the module docstring)."""
        harbor = self.harbor_task(task)
        if getattr(sandbox, "kind", None) != "docker":
            raise EnvFailure(f"terminal-task grades in a fresh docker container and carries the "
                             f"agent's artifacts with the Docker engine; the agent's sandbox is "
                             f"{getattr(sandbox, 'kind', '?')!r}: run with --sandbox docker")
        return await run_verifier(harbor, sandbox,
                                  lambda: ctx.open_sandbox(self.sandbox_spec(harbor)))
