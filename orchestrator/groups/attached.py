"""A rollout run away from the driver (on a Ray node, in a task service), attached to the
session the driver opened for it: setup, agent and grading here; scoring and closing there."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

import httpx

from envhub.envs.environment import Task
from envhub.envs.loader import LoadedEnv
from envhub.orchestrator.groups.plan import RolloutKey
from envhub.orchestrator.groups.rollout import PendingRollout, RolloutSetup, execute
from envhub.orchestrator.groups.setup import open_scratch
from envhub.sdk import AsyncSession
from envhub.sdk.types import Signal

MAX_HELD_SIGNALS = 10_000  # process signals one rollout carries back (as a verdict may)


@dataclass
class RemoteRollout:
    """What a node needs to run one rollout (pickled to it)."""

    key: RolloutKey
    group_id: str
    env_ref: str
    task: Task
    run_id: str
    agent: str
    agent_install: list[str]
    agent_on_host: bool
    sandbox_kind: str
    agent_kind: str | None
    model: str
    limits_override: dict[str, Any]
    gateway_url: str
    session_id: str
    api_key: str


async def attached_rollout(job: RemoteRollout, loaded: LoadedEnv, agent: Any
                           ) -> PendingRollout:
    """Run `job` here up to grading, in the driver's session (used, never closed). The
    process signals the runner posts for the agent (tool errors) are held in `p.signals`:
    posting one needs the admin key, which this side has not; the driver posts them."""
    prepare = getattr(agent, "prepare", None)  # in-sandbox agents build their bundle per node
    if getattr(agent, "in_sandbox", False) and prepare is not None:
        await prepare(job.agent_kind or job.sandbox_kind)
    scratch = open_scratch(job.run_id)  # if this process dies under it, the next run sweeps it
    http = httpx.AsyncClient(timeout=60)
    try:
        session = HeldSignals(job.gateway_url, job.session_id, job.api_key, http)
        rs = RolloutSetup(run_id=job.run_id, agent=agent, agent_name=job.agent,
                          link=AttachedLink(job.gateway_url, session),
                          sandbox_kind=job.sandbox_kind, scratch=scratch, model=job.model,
                          limits_override=job.limits_override, agent_kind=job.agent_kind,
                          agent_install=job.agent_install, agent_on_host=job.agent_on_host)
        p = await execute(job.key, job.group_id, loaded, job.task, rs)
        p.signals = session.held
        return p
    finally:
        await http.aclose()
        shutil.rmtree(scratch, ignore_errors=True)


class HeldSignals(AsyncSession):
    """The driver's session as a node sees it (its own key only): a process signal is kept
    here instead of posted (the gateway takes those from the runner's admin key alone, so an
    agent cannot award itself one), for the driver to post (`post_held_signals`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[Signal] = []

    async def signal(self, name: str, *, seq: int | None = None, value: float = 1.0,
                     info: dict | None = None) -> None:
        if len(self.held) < MAX_HELD_SIGNALS:
            self.held.append(Signal(name=name, seq=seq, value=value, info=info or {}))


async def post_held_signals(p: PendingRollout, signals: list[Signal]) -> PendingRollout:
    """The driver's side: post the signals a rollout run elsewhere held, with the runner's
    key, before the group is scored (process rewards read them from the pool). One the
    gateway refuses fails the rollout as env_failure: its process reward would be wrong."""
    try:
        for s in signals[:MAX_HELD_SIGNALS]:
            await p.session.signal(s.name, seq=s.seq, value=s.value, info=s.info)
    except Exception as e:  # noqa: BLE001 - the gateway refusing or gone: infrastructure
        p.fail("env_failure", f"gateway: cannot record the rollout's process signals: "
               f"{type(e).__name__}: {e}")
    return p


async def with_session(key: RolloutKey, group_id: str, rs: RolloutSetup) -> PendingRollout:
    """The driver's side of a rollout run elsewhere: its session opened in the pool first (so
    the pool knows every rollout before it is placed); failed as env_failure, with no session,
    when the gateway refuses."""
    p = PendingRollout(key, group_id)
    try:
        p.session = await rs.link.open_session(group_id, key)
    except Exception as e:  # noqa: BLE001 - gateway down or refusing: infrastructure
        p.fail("env_failure", f"gateway: cannot open a session: {type(e).__name__}: {e}")
    return p


class AttachedLink:
    """A GatewayLink whose one session was opened by the driver."""

    def __init__(self, url: str, session: Any) -> None:
        self.url, self._session = url, session

    async def open_session(self, group_id: str, key: RolloutKey) -> Any:
        return self._session

    async def pool_refusals(self, session_id: str, key: str | None = None
                            ) -> tuple[int, str | None]:
        """The session's calls refused for the pool's fault, asked with its own key (this
        side has no admin key)."""
        from envhub.orchestrator.groups.gateway_link import pool_refusals

        return await pool_refusals(self.url, session_id,
                                   key or getattr(self._session, "api_key", None))
