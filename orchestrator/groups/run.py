"""`envhub run`: groups of k samples per task across one or more environments, at most
`concurrency` rollouts in flight, results folder (`runs/<run_id>/` unless `out` says
otherwise), resume, and no leftovers.

Leak guarantees: every rollout closes its own sandboxes; at the end the run reaps anything still
labelled with its run id, removes its scratch folder (command agents' working folders) and
stops the gateway it started, on success, error or interruption alike (SIGINT, SIGTERM). A run
killed outright (SIGKILL) leaves its scratch folder, which the next run on the machine removes
once the owner process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from envhub.envs.agents import Agent, agents_for, make_agents
from envhub.envs.errors import RunConfigError
from envhub.envs.loader import LoadedEnv, check_tools
from envhub.orchestrator.catalog import load_env
from envhub.orchestrator.groups.config import RunConfig
from envhub.orchestrator.groups.dispatch import Dispatcher
from envhub.orchestrator.groups.executor import RolloutExecutor, RoutedExecutor, make_executor
from envhub.orchestrator.groups.gateway_link import GatewayLink
from envhub.orchestrator.groups.plan import GroupPlan, allocate, interleave
from envhub.orchestrator.groups.progress import RunProgress
from envhub.orchestrator.groups.results import ResultsFolder, RolloutRecord, summarize
from envhub.orchestrator.groups.scheduling import make_policy
from envhub.orchestrator.groups.services.hub import PREFIX, open_hub, served_envs
from envhub.orchestrator.groups.setup import (
    new_run_id,
    open_scratch,
    prepare_agent,
    raise_open_files_limit,
    rollout_setups,
    sandbox_kind,
    take_down,
)
from envhub.orchestrator.groups.stream import GroupRunner
from envhub.orchestrator.groups.task_metrics import TaskMetrics, run_metrics

log = logging.getLogger(__name__)
RUNS_DIR = Path("runs")  # results of runs without --out: runs/<run_id>/


@dataclass
class RunOutcome:
    run_id: str
    records: list[RolloutRecord]
    summary: dict[str, Any]
    out: Path  # the results folder


def plan_groups(config: RunConfig, served: dict[str, LoadedEnv] | None = None
                ) -> list[GroupPlan]:
    """Load the environments and their tasks; allocate tasks by weight; k samples each.
    `served`: the environments of task services, by reference (service:NAME)."""
    served = served or {}
    loaded = [served.get(c.ref) or load_env(c.ref) for c in config.envs]
    names = [le.name for le in loaded]
    if len(set(names)) != len(names):
        raise RunConfigError(f"environment listed twice ({', '.join(names)}); give each once "
                             "with a weight, e.g. arith=3")
    wanted = set(config.tasks)
    task_lists = []
    for le in loaded:
        tasks = le.env.load_tasks()
        check_tools(le, tasks)
        if wanted:
            tasks = [t for t in tasks if t.id in wanted]
        task_lists.append(tasks)
    counts = allocate(config.n, [c.weight for c in config.envs], [len(t) for t in task_lists])
    per_env = [[GroupPlan(le, t, config.k) for t in tasks[:count]]
               for le, tasks, count in zip(loaded, task_lists, counts, strict=True)]
    groups = interleave(per_env, [c.weight for c in config.envs])
    if not groups:
        hint = f" matching --task {', '.join(sorted(wanted))}" if wanted else ""
        raise RunConfigError(f"no tasks to run{hint} in {', '.join(names)}")
    return groups


async def run(config: RunConfig, console: Any = None, progress: bool = True,
              on_start: Callable[[str, Path], None] | None = None) -> RunOutcome:
    """Execute a run; raises RunConfigError/EnvLoadError/ManifestError/AgentSpecError before
    anything starts when the options or packages are bad. `on_start(run_id, results folder)` is
    called once the folder exists, before the first rollout."""
    raise_open_files_limit()
    make_policy(config.schedule)  # a dotted path that does not load stops the run here
    async with contextlib.AsyncExitStack() as stack:
        hub = await asyncio.to_thread(open_hub, config, log.warning)
        if hub is not None:
            stack.push_async_callback(hub.close)  # also when the plan fails or is interrupted
        served = await asyncio.to_thread(served_envs, hub, [c.ref for c in config.envs])
        metrics = run_metrics(config.metrics, hub, log.warning, stack)
        # In a thread: loading reads task files and may install a registry package, and a
        # registry install runs its own event loop.
        groups = await asyncio.to_thread(plan_groups, config, served)
        # Each environment's agent: --agent, else its own (vf: a verifiers environment's
        # harness), else `tool`; one that cannot act on an environment stops the run here.
        envs = {g.loaded.name: g.loaded.env for g in groups}
        specs = agents_for(config.agent, envs)
        agents = make_agents(specs, config.agent_install, config.agent_on_host)
        kinds = await asyncio.to_thread(
            lambda: {g.loaded.name: sandbox_kind(config.sandbox, g.loaded) for g in groups})
        agent_kinds: dict[str, str] = {}
        for agent in {id(a): a for a in agents.values()}.values():
            agent_kinds.update(await prepare_agent(
                agent, config.sandbox, {n: k for n, k in kinds.items() if agents[n] is agent}))
        routes: dict[str, RolloutExecutor] = {PREFIX: hub} if hub is not None else {}
        executor = RoutedExecutor(make_executor(config.executor), routes)
        stack.push_async_callback(executor.close)
        await executor.start()
        for g in {g.loaded.name: g for g in groups}.values():
            await executor.check(g.loaded, kinds[g.loaded.name])
        return await _run_started(config, (specs, agents), groups, kinds, agent_kinds, executor,
                                  console, progress, on_start, metrics)
    raise AssertionError("unreachable")  # the stack re-raises or the body returned


async def _run_started(config: RunConfig, agents: tuple[dict[str, str], dict[str, Agent]],
                       groups: list[GroupPlan],
                       kinds: dict[str, str], agent_kinds: dict[str, str],
                       executor: RolloutExecutor, console: Any, progress: bool,
                       on_start: Callable[[str, Path], None] | None,
                       metrics: TaskMetrics | None) -> RunOutcome:
    run_id = new_run_id()
    # Results are kept by default: a run's trajectories are the product, never a temp file.
    out = config.out or RUNS_DIR / run_id
    results = ResultsFolder(out)
    run_id = results.start(run_id, config.model_dump(mode="json"), config.resume)
    if on_start is not None:
        on_start(run_id, out)
    scratch = open_scratch(run_id, sweep=True)
    link: GatewayLink | None = None
    records: list[RolloutRecord] = []
    started = time.time()
    try:
        if config.gateway:
            link = GatewayLink.connect(config.gateway, config.admin_key or "")
        else:
            link = await GatewayLink.start(config.model, out / "pool.db",
                                           executor.gateway_host())
        specs, made = agents
        setups = {}  # per environment: its own agent
        for name, kind in kinds.items():
            setups.update(rollout_setups(run_id, made[name], specs[name], link, {name: kind},
                                         agent_kinds, scratch, config.max_turns,
                                         config.time_limit_s, config.agent_install,
                                         config.agent_on_host, metrics))
        runner = GroupRunner(run_id, {g.loaded.name: g.loaded for g in groups}, setups,
                             results, scratch, executor)
        total = sum(g.k for g in groups)
        with RunProgress(total, console) if progress else _NoProgress() as bar:
            slots = Dispatcher(make_policy(config.schedule), config.concurrency)
            await asyncio.gather(*(_run_group(g, runner, results, slots, bar, records)
                                   for g in groups))
    finally:
        if link is not None:
            await link.close()
        await take_down(run_id, {*kinds.values(), *agent_kinds.values()}, scratch)
    used = set(agents[0].values())
    summary = {"run_id": run_id, "agent": used.pop() if len(used) == 1 else agents[0],
               "started_at": started,
               "finished_at": time.time(), **summarize(records)}
    results.write_summary(summary)
    return RunOutcome(run_id, records, summary, out)


async def _run_group(g: GroupPlan, runner: GroupRunner, results: ResultsFolder,
                     slots: Dispatcher, bar: Any, records: list[RolloutRecord]) -> None:
    """One planned group through the runner: the samples `--resume` found finished count as
    they are (and are scored with the rest of their group), the others run."""
    earlier = {k: results.finished(k) for k in g.keys()}
    done_before = [rec for rec in earlier.values() if rec is not None]
    for rec in done_before:
        records.append(rec)
        bar.add(rec, resumed=True)
    todo = [k.sample for k, rec in earlier.items() if rec is None]
    if not todo:
        return
    new = await runner.run_group(g.loaded.name, g.task, g.k,
                                 f"{runner.run_id}:{g.loaded.name}:{g.task.id}", slots=slots,
                                 samples=todo, done_before=done_before, record_task=g.task.id)
    for rec in new:
        records.append(rec)
        bar.add(rec)


class _NoProgress:
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add(self, record: RolloutRecord, resumed: bool = False) -> None:
        return None
