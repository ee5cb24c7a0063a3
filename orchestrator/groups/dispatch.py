"""At most `concurrency` rollouts at once, started in the order a scheduling policy chooses
(orchestrator/groups/scheduling.py): the runner's replacement for a plain semaphore.

    dispatcher = Dispatcher(make_policy("seer"), concurrency=16)
    dispatcher.add_group(group_id, k)
    async with dispatcher.slot(group_id, index) as shown:   # waits for the policy's turn
        p = await executor.execute(...)
        shown.append(Observation(turns=p.turns, seconds=p.duration_s))

Slots are granted at the end of the event loop's current step, so groups added together (a
run's plan) are all known to the policy before the first grant.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from envhub.orchestrator.groups.scheduling import Observation, SchedulePolicy


class Dispatcher:
    def __init__(self, policy: SchedulePolicy, concurrency: int) -> None:
        self.policy, self.free, self.concurrency = policy, concurrency, concurrency
        self._waiting: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._granted: set[tuple[str, int]] = set()  # chosen before their slot() was entered
        self._abandoned: set[tuple[str, int]] = set()  # cancelled while waiting
        self._pending_grant = False

    @property
    def running(self) -> int:
        """Slots granted now (rollouts running, or about to)."""
        return self.concurrency - self.free

    @property
    def waiting(self) -> int:
        """Rollouts waiting for a slot."""
        return len(self._waiting)

    def add_group(self, group: str, k: int) -> None:
        self.policy.add_group(group, k)
        self._soon()

    @contextlib.asynccontextmanager
    async def slot(self, group: str, index: int) -> AsyncIterator[list[Observation]]:
        key = (group, index)
        if key in self._granted:
            self._granted.discard(key)
        else:
            fut = asyncio.get_running_loop().create_future()
            self._waiting[key] = fut
            self._soon()
            try:
                await fut
            except asyncio.CancelledError:
                if self._waiting.pop(key, None) is not None:
                    self._abandoned.add(key)  # never granted: the policy's pick is skipped
                else:
                    self._release()  # granted as it was cancelled: give the slot back
                raise
        shown: list[Observation] = []
        try:
            yield shown
        finally:
            self.policy.finished(group, index, shown[-1] if shown else Observation())
            self._release()

    def _release(self) -> None:
        self.free += 1
        self._soon()

    def _soon(self) -> None:
        if not self._pending_grant:
            self._pending_grant = True
            asyncio.get_running_loop().call_soon(self._grant)

    def _grant(self) -> None:
        self._pending_grant = False
        while self.free > 0:
            key = self.policy.next()
            if key is None:
                return
            if key in self._abandoned:
                self._abandoned.discard(key)
                continue
            self.free -= 1
            fut = self._waiting.pop(key, None)
            if fut is None:
                self._granted.add(key)
            else:
                fut.set_result(None)
