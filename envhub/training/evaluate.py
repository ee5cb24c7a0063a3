"""Held-out evaluation: one greedy (temperature 0) sample of each held-out task with the
current weights, scored like training rollouts; rows `eval/...` in OUT/metrics.jsonl.

Greedy, one sample per task: the same weights always give the same answers, so a change in
`eval/resolved_rate` between two evaluations is the weights', not sampling noise. The
completion-time component needs a group (it is relative to the group), so with one sample it is
0 and `eval/reward_mean` is outcome + process.
"""

from __future__ import annotations

import asyncio
from typing import Any

from envhub.envs.agents.tool_calling import ToolCallingAgent
from envhub.envs.runner.results import RolloutRecord
from envhub.envs.runner.stream import GroupRunner
from envhub.training.metrics import rollout_metrics
from envhub.training.tasks import EnvTasks


async def evaluate(runner: GroupRunner, envs: list[EnvTasks], version: int,
                   concurrency: int, agent: Any = None) -> dict[str, Any]:
    """Run every held-out task once (at most `concurrency` at a time); `eval/` metrics overall
    and, with several environments, per environment. `agent` defaults to the built-in agent at
    temperature 0; a command-line agent samples however it asks."""
    agent = agent or ToolCallingAgent(temperature=0.0)
    sem = asyncio.Semaphore(concurrency)

    async def one(env: EnvTasks, i: int) -> tuple[str, list[RolloutRecord]]:
        task = env.heldout[i]
        async with sem:
            gid = f"{runner.run_id}:eval:v{version:06d}:{env.name}:{task.id}"
            return env.name, await runner.run_group(env.ref, task, 1, gid, agent=agent)

    results = await asyncio.gather(*(one(e, i) for e in envs for i in range(len(e.heldout))))
    by_env: dict[str, list[RolloutRecord]] = {}
    for name, records in results:
        by_env.setdefault(name, []).extend(records)
    row: dict[str, Any] = rollout_metrics([r for rs in by_env.values() for r in rs], "eval/")
    if len(by_env) > 1:
        for name, records in sorted(by_env.items()):
            row.update(rollout_metrics(records, f"eval/{name}/"))
    return row
