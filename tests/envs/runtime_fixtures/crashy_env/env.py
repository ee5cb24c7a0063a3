"""Injects one infrastructure failure per task (`mode`):

ok               resolves normally
setup-crash      the sandbox fails to start (SandboxError, like an image build failure)
sandbox-crash    the sandbox dies during the agent's work; grading then finds it gone
grading-failure  the verifier reports it could not complete (Verdict.env_failure)
setup-hang       setup never finishes (infra timeout; manifest setup_timeout_s = 5)
docker-kill      a real container is killed during the agent's work (run with --sandbox
                 docker; the other modes use an in-process sandbox whatever the flag)
bad-image        the task's Dockerfile fails to build (a real `docker build`, --sandbox docker)
oversized-output not infrastructure: the agent leaves an answer past the read limit, which
                 the verifier cannot read (the agent's doing: scored 0, never env_failure)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from envhub.envs.environment import RunContext, Task, Verdict
from envhub.envs.loader import rows_to_tasks, task_rows
from envhub.envs.manifest import Manifest
from envhub.envs.sandbox.base import MAX_READ_BYTES, Sandbox
from envhub.envs.sandbox.errors import SandboxError


class CrashyEnv:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder, self.manifest = folder, manifest

    def load_tasks(self) -> list[Task]:
        return rows_to_tasks(task_rows(self.folder, self.manifest.tasks))

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        mode = task.data["mode"]
        if mode == "setup-crash":
            raise SandboxError("container exited with code 137 while starting")
        if mode == "setup-hang":
            await asyncio.sleep(3600)
        spec = self.manifest.sandbox
        if mode == "bad-image":
            spec = spec.model_copy(update={"dockerfile": "broken.Dockerfile"})
        elif mode != "docker-kill":
            spec = spec.model_copy(update={"kind": "none"})
        return await ctx.open_sandbox(spec)

    def tools(self, task: Task) -> list[str]:
        return ["submit"]

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        await sandbox.write_file("/tmp/solved", b"1")
        mode = task.data["mode"]
        if mode == "sandbox-crash":
            await sandbox.close()  # the sandbox is gone, as after an OOM kill
        if mode == "oversized-output":
            await sandbox.write_file("/tmp/solved", b"1" * (MAX_READ_BYTES + 1))
        if mode == "docker-kill":
            from envhub.envs.sandbox.engine import docker_client

            await asyncio.to_thread(lambda: docker_client().containers.get(sandbox.id).kill())

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        if task.data["mode"] == "grading-failure":
            return Verdict(0.0, False, env_failure="grader could not start")
        if task.data["mode"] == "docker-kill":  # grading runs a command, as real graders do
            result = await sandbox.exec("cat /tmp/solved", timeout=30)
            return Verdict(float(result.stdout == "1"), result.stdout == "1")
        solved = (await sandbox.read_file("/tmp/solved")) == b"1"
        return Verdict(1.0 if solved else 0.0, solved)
