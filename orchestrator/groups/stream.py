"""The group runner of `envhub run` and `envhub train`: groups run on request, for a caller
that decides what to run next (the asynchronous `envhub train` keeps N rollouts in flight and
starts a new group whenever slots free up; `envhub run` plans every group up front and hands
them all at once, with what `--resume` found finished: see run.py).

    runner = await GroupRunner.open(["arith"], gateway=url, admin_key=key, agent=agent,
                                    run_id=run_id, out=folder)
    records = await runner.run_group("arith", task, k=8, group_id="...")   # scored, closed
    await runner.aclose()                                                   # reaps, cleans up

The same leak guarantees as `envhub run`: every rollout closes its sandboxes, `aclose` reaps
anything still labelled with the run id and removes the scratch folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.envs.agents.base import Agent
from envhub.envs.environment import Task
from envhub.envs.loader import LoadedEnv
from envhub.orchestrator.groups.gateway_link import GatewayLink
from envhub.orchestrator.groups.plan import RolloutKey
from envhub.orchestrator.groups.results import ResultsFolder, RolloutRecord
from envhub.orchestrator.groups.rollout import PendingRollout, RolloutSetup, execute
from envhub.orchestrator.groups.scheduling import Observation
from envhub.orchestrator.groups.scoring import close_session, finalize_group
from envhub.orchestrator.groups.setup import (
    load_envs,
    open_scratch,
    prepare_agent,
    raise_open_files_limit,
    rollout_setups,
    take_down,
)

if TYPE_CHECKING:
    from envhub.orchestrator.groups.dispatch import Dispatcher
    from envhub.orchestrator.groups.executor import RolloutExecutor

log = logging.getLogger(__name__)


async def rollout_group(keys: list[RolloutKey], group_id: str, loaded: LoadedEnv, task: Task,
                        rs: RolloutSetup, sem: asyncio.Semaphore | None = None, *,
                        executor: RolloutExecutor | None = None,
                        slots: Dispatcher | None = None) -> list[PendingRollout]:
    """Run `keys` (samples of one group) concurrently, up to grading; sessions stay open for
    `finalize_group`. A runner bug in one rollout is that rollout's env_failure; on
    cancellation the sessions already opened are closed as env_failure ("interrupted").
    `executor` runs each rollout (default: in this process, orchestrator/groups/executor.py);
    `slots` (a Dispatcher with a scheduling policy, orchestrator/groups/dispatch.py) or `sem`
    bounds how many
    run at once and in which order."""
    finished: list[PendingRollout] = []
    if slots is not None:
        slots.add_group(group_id, len(keys))

    async def one(index: int, key: RolloutKey) -> PendingRollout:
        gate: Any = (slots.slot(group_id, index) if slots is not None
                     else sem if sem is not None else contextlib.nullcontext())
        async with gate as shown:
            running = rs.metrics.in_flight.labels(loaded.name) if rs.metrics else None
            try:
                if running is not None:
                    running.inc()
                p = await (executor.execute(key, group_id, loaded, task, rs)
                           if executor is not None else execute(key, group_id, loaded, task, rs))
            except Exception as e:  # a runner bug must not take the other rollouts down
                log.exception("rollout %s failed in the runner", key.text)
                p = PendingRollout(key, group_id).fail("env_failure", f"runner: {e}")
            finally:
                if running is not None:
                    running.dec()
            if slots is not None:  # what the policy learns of the group (Seer's probe)
                shown.append(Observation(turns=p.turns, seconds=p.duration_s))
            finished.append(p)
            return p

    try:
        return list(await asyncio.gather(*(one(i, k) for i, k in enumerate(keys))))
    except asyncio.CancelledError:
        # Sessions whose rollout got this far are closed as infrastructure failures (not
        # scored), so the pool holds no dangling sessions.
        await asyncio.shield(asyncio.gather(*(
            close_session(p.session, "env_failure", "interrupted") for p in finished)))
        raise


class GroupRunner:
    """Environments loaded once, one gateway link, one scratch folder; `run_group` on demand.
    Rollouts run where `executor` puts them (None: in this process); the caller starts and
    closes the executor."""

    def __init__(self, run_id: str, envs: dict[str, LoadedEnv], setups: dict[str, RolloutSetup],
                 results: ResultsFolder | None, scratch: Path,
                 executor: RolloutExecutor | None = None) -> None:
        self.run_id, self.envs, self.setups = run_id, envs, setups
        self.results, self.scratch, self.executor = results, scratch, executor

    @classmethod
    async def open(cls, refs: list[str], *, gateway: str, admin_key: str,
                   agent: Agent | Mapping[str, Agent],
                   run_id: str, out: Path | None = None, max_turns: int | None = None,
                   time_limit_s: float | None = None, sandbox: str | None = None,
                   agent_install: list[str] | None = None, agent_on_host: bool = False,
                   executor: RolloutExecutor | None = None,
                   served: dict[str, LoadedEnv] | None = None,
                   metrics: Any = None) -> GroupRunner:
        """Load `refs` (environment names, paths or registry refs) and connect to `gateway`.
        Raises the loader's errors (with their fix) for a bad environment.
        `agent_install`/`agent_on_host` are the agent's (make_agent's), for an executor that
        rebuilds it on another machine; `agent` maps references to agents where environments
        run different ones (`envs.agents.agents_for`). `served`: task services' environments
        by reference."""
        raise_open_files_limit()
        envs, kinds = await asyncio.to_thread(load_envs, refs, sandbox, served)
        agents = agent if isinstance(agent, Mapping) else dict.fromkeys(refs, agent)
        agent_kinds: dict[str, str] = {}
        for one in {id(a): a for a in agents.values()}.values():  # in-sandbox command agents
            agent_kinds.update(await prepare_agent(
                one, sandbox, {r: k for r, k in kinds.items() if agents[r] is one}))
        results = None
        if out is not None:
            results = ResultsFolder(out)
            (out / "rollouts").mkdir(parents=True, exist_ok=True)
        scratch = open_scratch(run_id, sweep=True)
        link = GatewayLink.connect(gateway, admin_key)
        setups = {}  # per environment: its agent (`agent`, or its own from the mapping)
        for ref, kind in kinds.items():
            setups.update(rollout_setups(run_id, agents[ref], agents[ref].name, link,
                                         {ref: kind}, agent_kinds, scratch, max_turns,
                                         time_limit_s, agent_install, agent_on_host, metrics))
        return cls(run_id, envs, setups, results, scratch, executor)

    def tasks(self, ref: str) -> list[Task]:
        return self.envs[ref].env.load_tasks()

    async def run_group(self, ref: str, task: Task, k: int, group_id: str,
                        agent: Agent | None = None, sem: asyncio.Semaphore | None = None,
                        slots: Dispatcher | None = None, *, samples: list[int] | None = None,
                        done_before: list[RolloutRecord] | None = None,
                        record_task: str | None = None) -> list[RolloutRecord]:
        """k samples of `task`, scored together and closed; `sem` bounds rollouts in flight
        across calls, or `slots` (a Dispatcher) does and starts them in its policy's order.
        `agent` overrides the runner's (e.g. a greedy one for evaluation) and runs in this
        process: an executor rebuilds agents on its machines from their command line, which
        would lose this object's settings. `samples`: which of the k to run (`--resume`: those
        not finished, `done_before` holding the records of the others, scored with them).
        Records are written to OUT/rollouts when the runner has an `out` folder, named after
        `record_task` (default the group's tag: the same task runs again in later groups)."""
        loaded, rs = self.envs[ref], self.setups[ref]
        executor = self.executor
        if agent is not None:
            rs = dataclasses.replace(rs, agent=agent, agent_name=agent.name)
            executor = None
        keys = [RolloutKey(loaded.name, task.id, i)
                for i in (range(k) if samples is None else samples)]
        pendings = await rollout_group(keys, group_id, loaded, task, rs, sem,
                                       executor=executor, slots=slots)
        try:
            records = await finalize_group(pendings, loaded, rs.agent_name,
                                           list(done_before or []), rs.link, task)
        except asyncio.CancelledError:
            # Interrupted while scoring: the group is not whole, so none of it counts.
            await asyncio.shield(asyncio.gather(*(
                close_session(p.session, "env_failure", "interrupted", rs.link)
                for p in pendings)))
            raise
        if rs.metrics is not None:
            rs.metrics.finished(records)
        if self.results is not None:
            tag = record_task or group_id.removeprefix(f"{self.run_id}:")
            for key, rec in zip(keys, records, strict=True):
                self.results.write(RolloutKey(key.env, tag, key.sample), rec)
        return records

    async def aclose(self) -> None:
        """Reap what is left of the run's sandboxes (the environments' and in-sandbox agents')
        and remove the scratch folder."""
        kinds = {kind for rs in self.setups.values() for kind in (rs.sandbox_kind, rs.agent_kind)
                 if kind}
        await take_down(self.run_id, kinds, self.scratch)
