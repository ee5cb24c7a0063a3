"""Held-out evaluation: `samples` samples of each held-out task with the current weights, drawn
as training draws them (the agent's own temperature), scored like training rollouts; rows
`eval/...` in OUT/metrics.jsonl.

Sampled by default: RL on a policy that already solves a task greedily mostly sharpens it (its
sampled success rises towards its greedy one), which a greedy evaluation cannot see; the
mean over several samples per task (avg@n) measures the policy that training optimises.
`greedy=True` runs one temperature-0 sample per task instead (the same weights always give the
same answers).

The sampled evaluations of a run share their random numbers (`seed`: the built-in agent asks
for a sampling seed per task, sample and turn; the engine samples by inverse CDF from a
generator with that seed): evaluation after step N samples the same uniforms as the one before
the first step, so a token changes only where the weights moved its probabilities across the
draw. Each evaluation is still avg@n of the policy; the difference between two is less noisy
than with fresh draws (a quarter less spread after 30 steps: bench/bench_eval_noise.py).

The completion-time component is relative within a task's samples (0 with one sample);
`eval/resolved_rate` is the plain solved fraction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from envhub.envs.agents.tool_calling import ToolCallingAgent
from envhub.orchestrator.groups.results import RolloutRecord
from envhub.orchestrator.groups.stream import GroupRunner
from envhub.orchestrator.training.metrics import rollout_metrics
from envhub.orchestrator.training.tasks import EnvTasks


async def evaluate(runner: GroupRunner, envs: list[EnvTasks], version: int,
                   concurrency: int, agent: Any = None, samples: int = 1,
                   greedy: bool = False, seed: int | None = None) -> dict[str, Any]:
    """Run every held-out task `samples` times (a task's samples together, at most
    `concurrency` rollouts at a time); `eval/` metrics overall and, with several environments,
    per environment. `agent`: one, or a mapping by environment reference; where none is given,
    the built-in agent (at temperature 0 with `greedy`, then one sample per task; sampled with
    `seed`'s random numbers when given); a command-line agent samples however it asks."""
    builtin = ToolCallingAgent(temperature=0.0) if greedy else ToolCallingAgent(seed=seed)
    # one agent, or one per environment reference (an environment's own agent, e.g. vf)
    chosen = agent if isinstance(agent, Mapping) else {e.ref: agent for e in envs}
    n = 1 if greedy else samples
    sem = asyncio.Semaphore(max(1, concurrency // n))

    async def one(env: EnvTasks, i: int) -> tuple[str, list[RolloutRecord]]:
        task = env.heldout[i]
        async with sem:
            gid = f"{runner.run_id}:eval:v{version:06d}:{env.name}:{task.id}"
            return env.name, await runner.run_group(env.ref, task, n, gid,
                                                    agent=chosen.get(env.ref) or builtin)

    results = await asyncio.gather(*(one(e, i) for e in envs for i in range(len(e.heldout))))
    by_env: dict[str, list[RolloutRecord]] = {}
    for name, records in results:
        by_env.setdefault(name, []).extend(records)
    row: dict[str, Any] = rollout_metrics([r for rs in by_env.values() for r in rs], "eval/")
    if len(by_env) > 1:
        for name, records in sorted(by_env.items()):
            row.update(rollout_metrics(records, f"eval/{name}/"))
    return row
