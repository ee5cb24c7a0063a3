"""Finishing a group: read each done rollout's trajectory (turns, process signals), compute the
composite rewards for the whole group, post every component to the pool as its own reward
event, and close the sessions with their final status."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from envhub.envs.environment import EnvFailure, Task
from envhub.envs.loader import LoadedEnv
from envhub.envs.rewards import SampleScore, UsesGateway, components, score_group
from envhub.orchestrator.groups.results import RolloutRecord
from envhub.orchestrator.groups.rollout import PendingRollout
from envhub.sdk.types import RewardEvent

log = logging.getLogger(__name__)


async def finalize_group(pendings: list[PendingRollout], loaded: LoadedEnv, agent_name: str,
                         earlier: list[RolloutRecord], link: Any = None,
                         task: Task | None = None) -> list[RolloutRecord]:
    """Records for `pendings` (same order), scored with the environment's reward components
    and weights. `earlier` are this group's rollouts finished in a previous attempt
    (--resume): they count towards the group's median time. `link` (the runner's
    GatewayLink) closes with the admin key a session whose own close did not get through,
    and is the default endpoint of model judges. `task` is shown to model judges.
    Scoring runs in a thread (a judge waits on HTTP); a component's EnvFailure (a judge
    that could not answer) makes every scored rollout of the group env_failure."""
    scores: dict[int, SampleScore] = {}
    for i, p in enumerate(pendings):
        if p.status != "done":
            continue
        try:
            trajectory = await p.session.trajectory()
        except Exception as e:  # noqa: BLE001 - without the trajectory the rollout cannot be scored
            p.fail("env_failure", f"gateway: trajectory unavailable: {type(e).__name__}: {e}")
            continue
        assert p.verdict is not None
        scores[i] = SampleScore(
            outcome=p.verdict.outcome, resolved=p.verdict.resolved, duration_s=p.duration_s,
            signals=[*trajectory.signals, *p.verdict.signals],
            turn_seqs=[t.seq for t in trajectory.turns],
            verdict_info=_jsonable(p.verdict.info), output=p.verdict.output,
            instruction=task.instruction if task else "", task_data=task.data if task else {})
    previous = [SampleScore(r.outcome or 0.0, bool(r.resolved), r.duration_s)
                for r in earlier if r.status == "done"]
    order = list(scores)
    if link is not None:
        for component in loaded.rewards.values():
            if isinstance(component, UsesGateway):
                component.use_gateway(link.url, link.admin_key)
    try:
        scored = (await asyncio.to_thread(
            score_group, [scores[i] for i in order] + previous,
            loaded.manifest.reward_weights(), loaded.rewards))[: len(order)]
    except EnvFailure as e:  # not the agents' doing: the group is excluded, not scored 0
        for i in order:
            pendings[i].fail("env_failure", f"scoring: {e}")
        order, scored = [], []
    events_of = dict(zip(order, scored, strict=True))

    records = []
    for i, p in enumerate(pendings):
        events = events_of.get(i, [])
        if events:
            try:
                await _post_rewards(p.session, events)
            except Exception as e:  # noqa: BLE001
                p.fail("env_failure", f"gateway: posting rewards failed: {type(e).__name__}: {e}")
                events = []
        await close_session(p.session, p.status, p.reason, link)
        records.append(_record(p, agent_name, events))
    return records


async def close_session(session: Any, status: str, reason: str | None, link: Any = None
                        ) -> None:
    """Close through the runner's session (it holds the admin key, which a close needs); if
    that does not get through (a timeout on a loaded machine, a dropped connection), again
    through `link`: a session left open would keep its group unfinished, and a trainer waiting
    for it would wait forever."""
    if session is None:
        return
    try:
        await session.aclose(status=status, reason=reason)  # also releases its HTTP client
        return
    except Exception as e:  # noqa: BLE001 - the record on disk still carries the status
        error = e
    sid = getattr(session, "id", "?")
    if link is not None:
        try:
            await link.close_session(sid, status, reason)
            log.info("closed session %s with the admin key (its own close failed: %s: %s)",
                     sid, type(error).__name__, error)
            return
        except Exception as e:  # noqa: BLE001
            error = e
    log.warning("closing session %s failed: %s: %s", sid, type(error).__name__, error)


async def _post_rewards(session: Any, events: list[RewardEvent]) -> None:
    takes_weight = "weight" in inspect.signature(session.reward).parameters

    async def post(e: RewardEvent) -> None:
        extra: dict[str, Any] = {"weight": e.weight} if takes_weight else {}
        info = e.info if takes_weight else {**e.info, "weight": e.weight}
        await session.reward(e.kind, e.value, name=e.name, seq=e.seq, info=info, **extra)

    await asyncio.gather(*(post(e) for e in events))


def _record(p: PendingRollout, agent_name: str, events: list[RewardEvent]) -> RolloutRecord:
    done = p.status == "done" and bool(events)
    return RolloutRecord(
        env=p.key.env, task_id=p.key.task_id, sample=p.key.sample, group_id=p.group_id,
        session_id=getattr(p.session, "id", None), agent=agent_name, status=p.status,
        reason=p.reason, stopped=p.stopped, turns=p.turns,
        outcome=p.verdict.outcome if done and p.verdict else None,
        resolved=p.verdict.resolved if done and p.verdict else None,
        components=components(events) if done else {},
        rewards=[e.model_dump(mode="json") for e in events],
        duration_s=round(p.duration_s, 3), setup_s=round(p.setup_s, 3),
        verify_s=round(p.verify_s, 3),
        verdict=_jsonable(p.verdict.info) if p.verdict else {},
        agent_info=_jsonable(p.agent_info), node=p.node,
    )


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    import json

    return json.loads(json.dumps(data, default=str))
