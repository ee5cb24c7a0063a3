"""Where rollouts run: the extension point between the runner (or a training loop) and the
machines. `envhub run --executor NAME`; the table maps names to dotted paths, and a dotted path
(`package.module:Class`) is taken as well.

Contract: the driver keeps the gateway and the pool. `execute()` takes one rollout up to grading
and returns its `PendingRollout` with the session still open (the caller scores the group and
closes the sessions, `scoring.finalize_group`). It never raises for a rollout's own failure:
infrastructure problems come back as `env_failure` with a reason.

Plugging one into a loop of one's own (e.g. `envhub train`):

    executor = make_executor("ray")
    await executor.start()                       # connects to RAY_ADDRESS
    host = executor.gateway_host()               # bind the gateway there
    pending = await executor.execute(key, group_id, loaded, task, setup)
    ...
    await executor.close()
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from envhub.envs.environment import Task
from envhub.envs.loader import LoadedEnv
from envhub.orchestrator.groups.plan import RolloutKey
from envhub.orchestrator.groups.plugins import load_named
from envhub.orchestrator.groups.rollout import PendingRollout, RolloutSetup, execute

EXECUTORS = {
    "inprocess": "envhub.orchestrator.groups.executor:InProcessExecutor",
    "ray": "envhub.orchestrator.groups.ray_executor:RayExecutor",
}


class RolloutExecutor(Protocol):
    name: str

    async def start(self) -> None:
        """Connect to the machines; raises RunConfigError (with the fix) when it cannot."""

    def gateway_host(self) -> str:
        """The address an in-process gateway binds to so that the rollouts reach it."""

    async def check(self, loaded: LoadedEnv, sandbox_kind: str) -> None:
        """Raise RunConfigError when no machine can ever run this environment's rollouts."""

    async def execute(self, key: RolloutKey, group_id: str, loaded: LoadedEnv, task: Task,
                      rs: RolloutSetup) -> PendingRollout:
        """One rollout up to grading; its session stays open."""

    async def close(self) -> None:
        """Release the machines (rollouts are all finished or cancelled by now)."""


class InProcessExecutor:
    """Every rollout in this process's event loop (the default)."""

    name = "inprocess"

    async def start(self) -> None:
        return None

    def gateway_host(self) -> str:
        return "127.0.0.1"

    async def check(self, loaded: LoadedEnv, sandbox_kind: str) -> None:
        return None

    async def execute(self, key: RolloutKey, group_id: str, loaded: LoadedEnv, task: Task,
                      rs: RolloutSetup) -> PendingRollout:
        return await execute(key, group_id, loaded, task, rs)

    async def close(self) -> None:
        return None


class RoutedExecutor:
    """The run's executor, except for environments whose reference starts with a prefix of
    `routes` (`service:NAME` → the task services' hub): theirs."""

    def __init__(self, default: RolloutExecutor, routes: dict[str, RolloutExecutor]) -> None:
        self.default, self.routes = default, routes
        self.name = default.name

    def of(self, loaded: LoadedEnv) -> RolloutExecutor:
        for prefix, executor in self.routes.items():
            if loaded.ref.startswith(prefix):
                return executor
        return self.default

    async def start(self) -> None:
        await self.default.start()
        for executor in self.routes.values():
            await executor.start()

    def gateway_host(self) -> str:
        """The default's, unless that is this process and a route reaches other machines."""
        if self.default.name != InProcessExecutor.name or not self.routes:
            return self.default.gateway_host()
        return next(iter(self.routes.values())).gateway_host()

    async def check(self, loaded: LoadedEnv, sandbox_kind: str) -> None:
        await self.of(loaded).check(loaded, sandbox_kind)

    async def execute(self, key: RolloutKey, group_id: str, loaded: LoadedEnv, task: Task,
                      rs: RolloutSetup) -> PendingRollout:
        return await self.of(loaded).execute(key, group_id, loaded, task, rs)

    async def close(self) -> None:
        """Close every route, then the default, each also when closing another failed."""
        async with contextlib.AsyncExitStack() as stack:
            for executor in [self.default, *reversed(self.routes.values())]:
                stack.push_async_callback(executor.close)


def make_executor(name: str) -> RolloutExecutor:
    """An executor from the table's name or a `package.module:Class` path."""
    executor: RolloutExecutor = load_named(name, EXECUTORS, "--executor")
    return executor
