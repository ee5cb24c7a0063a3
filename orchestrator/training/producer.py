"""Rollouts beside the trainer: an asyncio loop in its own thread that keeps groups running.

At most `concurrency` rollouts run at once, started by a Dispatcher in its scheduling policy's
order (orchestrator/groups/dispatch.py, scheduling.py), each where the executor places it (in this
process, or a Ray task: orchestrator/groups/executor.py).

Asynchronous mode (`start()`): new groups (the next tasks of the stream) are launched while
fewer than `buffer` groups are launched but not yet taken by the trainer, and
- with `fifo` (the default), only when the rollouts launched leave room for the whole group: a
  group's k samples start together, so they run under the same load and the completion-time
  reward stays relative within the group;
- with a reordering policy (`seer`), as soon as the buffer has room: the launched groups' samples
  wait in the Dispatcher, and the policy chooses which start (Seer: each group's probe first,
  then the rest longest-first), so it has the whole buffer to choose from.
Rollouts never wait for the trainer otherwise: a weight push lands while they run and their
later turns carry the new version (the engine stamps each turn).
Synchronous mode (`run_groups`): the caller hands one step's groups and waits for all of them
(their samples queue in the Dispatcher, as a batch does in a synchronous RL system).

Generation order is launch order: the trainer's window runs over it. Each group's state
(launched, finished with its records, released by the trainer) is in the run's `GroupLedger`
(orchestrator/training/ledger.py): the producer writes launches and finishes there and reads
how many groups are outstanding. A group is finished once every sample is scored and its
session closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from envhub.envs.environment import Task
from envhub.orchestrator.groups.dispatch import Dispatcher
from envhub.orchestrator.groups.executor import InProcessExecutor, RolloutExecutor
from envhub.orchestrator.groups.scheduling import make_policy
from envhub.orchestrator.groups.setup import load_envs
from envhub.orchestrator.groups.stream import GroupRunner
from envhub.orchestrator.training.ledger import GroupLedger
from envhub.orchestrator.training.tasks import EnvTasks

T = TypeVar("T")
SHUTDOWN_S = 60.0  # longest wait for cancelled rollouts to clean up


class ProducerFailed(RuntimeError):
    """The rollout loop itself broke (not a rollout: those end as env_failure)."""


class Producer:
    def __init__(self, stream: Iterator[tuple[EnvTasks, Task]], ledger: GroupLedger, *,
                 concurrency: int, buffer: int, schedule: str = "fifo",
                 executor: RolloutExecutor | None = None) -> None:
        self.stream, self.ledger, self.k = stream, ledger, ledger.k
        self.concurrency, self.buffer = concurrency, buffer
        self.executor: RolloutExecutor = executor or InProcessExecutor()
        self.admit: Any = None  # the stream's difficulty filter (its counts go into the rows)
        self.slots = Dispatcher(make_policy(schedule), concurrency)
        self._whole_groups = schedule == "fifo"  # launch a group only when all of it can start
        self._failure: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="envhub-rollouts",
                                        daemon=True)
        self._thread.start()
        self._wake: asyncio.Event | None = None
        self._main: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped = False  # stop() ran
        self._tasks: set[asyncio.Task[None]] = set()
        self.runner: GroupRunner | None = None
        self._executor_started = False

    # -- called from the trainer's thread ---------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Rollouts running now."""
        return self.slots.running

    @property
    def queued(self) -> int:
        """Rollouts launched and waiting for a slot."""
        return self.slots.waiting

    def start_executor(self, refs: list[str], served: dict[str, Any] | None = None) -> str:
        """Connect the executor to its machines (on the rollout loop) and check that they can
        run the rollouts of environments `refs`; returns the address the gateway must listen
        on for its rollouts to reach it. Raises RunConfigError (with the fix) when the
        machines cannot be reached or can never place a rollout, as `envhub run` does."""

        async def begin() -> None:
            await self.executor.start()
            if self.executor.name == InProcessExecutor.name:  # places any rollout: no check
                return
            envs, kinds = await asyncio.to_thread(load_envs, refs, None, served)
            for ref, loaded in envs.items():
                await self.executor.check(loaded, kinds[ref])

        self._executor_started = True  # closed by stop() even when starting failed half-way
        self.call(begin())
        return self.executor.gateway_host()

    def open(self, **options: Any) -> GroupRunner:
        """Open the group runner on the rollout loop (`GroupRunner.open` options), its rollouts
        placed by the executor."""
        self.runner = self.call(GroupRunner.open(run_id=self.ledger.run_id,
                                                 executor=self.executor,
                                                 **options))
        return self.runner

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the rollout loop (beside the rollouts in flight) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def start(self) -> None:
        """Asynchronous mode: keep launching groups until `stop()`."""

        async def begin() -> None:
            self.ledger.on_release(self._poke_soon)
            self._main = asyncio.get_running_loop().create_task(self._produce())
            self._main.add_done_callback(self._on_main_done)

        self.call(begin())

    def run_groups(self, n: int) -> list[str]:
        """Synchronous mode: launch the next `n` groups of the stream, wait for all of them;
        returns their ids."""

        async def batch() -> list[str]:
            started = [self._launch() for _ in range(n)]
            await asyncio.gather(*(t for _, t in started))
            return [gid for gid, _ in started]

        return self.call(batch())

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until a group finished after `seen` (the ledger's `finished` count the caller
        saw), the producer failed, or `timeout`; returns the new count. Raises
        ProducerFailed."""
        finished = self.ledger.wait_finished(seen, timeout, lambda: self._failure is not None)
        self.check()
        return finished

    def check(self) -> None:
        if self._failure is not None:
            raise ProducerFailed(f"the rollout loop failed: {type(self._failure).__name__}: "
                                 f"{self._failure}") from self._failure

    def stop(self) -> None:
        """Cancel the rollouts in flight (their sessions close as env_failure "interrupted"),
        close the runner, stop the thread. Once; a second call does nothing."""
        if self._stopped:
            return
        self._stopped = True

        async def shutdown() -> None:
            self._stopping = True  # no new group from here on
            if self._main is not None:
                self._main.cancel()
                await asyncio.gather(self._main, return_exceptions=True)
            while self._tasks:
                tasks = list(self._tasks)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            # A cancelled group's rollouts finish their own clean-up (killing an agent's
            # processes, closing its session) after the group has given up on them.
            rest = asyncio.all_tasks() - {asyncio.current_task()}
            if rest:
                await asyncio.wait(rest, timeout=SHUTDOWN_S)
            if self.runner is not None:
                await self.runner.aclose()
            if self._executor_started:
                await self.executor.close()

        try:
            self.call(shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=SHUTDOWN_S)
            if not self._thread.is_alive():
                self._loop.close()

    # -- on the rollout loop ------------------------------------------------------------------

    def _poke_soon(self) -> None:  # from the trainer's thread: groups released
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing to launch any more
            self._loop.call_soon_threadsafe(self._poke)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _room(self) -> bool:
        if self.ledger.outstanding() >= self.buffer:
            return False
        # A group whose k exceeds the concurrency still starts, alone.
        running = self.ledger.running()
        return not self._whole_groups or running == 0 or (running + 1) * self.k <= self.concurrency

    async def _produce(self) -> None:
        self._wake = asyncio.Event()
        while True:
            while not self._room():
                self._wake.clear()
                await self._wake.wait()
            self._launch()

    def _launch(self) -> tuple[str, asyncio.Task[None]]:
        if self._stopping:
            raise asyncio.CancelledError
        env, task = next(self.stream)
        gid = self.ledger.launch(env.name, task.id)
        t = asyncio.get_running_loop().create_task(self._group(env, task, gid))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return gid, t

    async def _group(self, env: EnvTasks, task: Task, gid: str) -> None:
        assert self.runner is not None, "open() the runner first"
        try:
            records = await self.runner.run_group(env.ref, task, self.k, gid, slots=self.slots)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a broken runner: the trainer must hear of it, not hang
            self._fail(e)
            raise
        self.ledger.finish(gid, records)
        self._poke()

    def _fail(self, e: BaseException) -> None:
        self._failure = e
        self.ledger.wake()

    def _on_main_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())  # type: ignore[arg-type]

