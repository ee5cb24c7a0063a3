"""One rollout, up to grading: open its session, set up its sandbox, run the agent, verify.

The session stays open afterwards: rewards need the whole group (time is relative to the
group's median), so `scoring.finalize_group` posts them and closes the sessions.
Failure mapping: setup/grading/sandbox/gateway problems → `env_failure` with a reason (never a
reward of 0); the agent's own failures → `agent_error`; hitting a limit is a normal end.
Every process of the agent phase is killed before grading (`Sandbox.end_processes`), and every
sandbox the rollout opened is closed before this returns, whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.envs.agents.base import Agent, AgentContext
from envhub.envs.environment import EnvFailure, RunContext, Task, Verdict
from envhub.envs.errors import AgentError
from envhub.envs.loader import LoadedEnv
from envhub.envs.manifest import AgentLimits, SandboxSpec
from envhub.envs.runner.memory_sandbox import MemorySandbox
from envhub.envs.runner.plan import RolloutKey
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxError

log = logging.getLogger(__name__)
AGENT_GRACE_S = 30.0  # beyond the agent's own time limit before the runner stops it


@dataclass
class PendingRollout:
    key: RolloutKey
    group_id: str
    session: Any = None
    status: str = "done"
    reason: str | None = None
    stopped: str | None = None
    turns: int = 0
    agent_info: dict[str, Any] = field(default_factory=dict)
    verdict: Verdict | None = None
    duration_s: float = 0.0
    setup_s: float = 0.0
    verify_s: float = 0.0

    def fail(self, status: str, reason: str) -> PendingRollout:
        self.status, self.reason = status, reason[:2000]
        return self


class SandboxTracker:
    """Opens the rollout's sandboxes (the environment may open several) and closes them all."""

    def __init__(self, run_id: str, kind: str, package_root: Path) -> None:
        self.run_id, self.kind, self.package_root = run_id, kind, package_root
        self.opened: list[Sandbox] = []

    async def open(self, spec: SandboxSpec) -> Sandbox:
        if spec.kind == "none" or self.kind == "none":
            box: Sandbox = MemorySandbox()
        else:
            from envhub.envs.sandbox import open_sandbox

            box = await open_sandbox(self.kind, spec, run_id=self.run_id,
                                     package_root=self.package_root)
        self.opened.append(box)
        return box

    async def close_all(self) -> None:
        while self.opened:
            box = self.opened.pop()
            try:
                await asyncio.shield(box.close())
            # closing must not mask the rollout's result; reap() at the end of the run follows
            except Exception as e:  # noqa: BLE001
                log.warning("closing sandbox %s failed: %s", getattr(box, "id", "?"), e)


@dataclass
class RolloutSetup:
    """Everything a rollout needs besides its key: shared by all rollouts of a run."""

    run_id: str
    agent: Agent
    agent_name: str
    link: Any  # GatewayLink
    sandbox_kind: str
    scratch: Path
    model: str
    limits_override: dict[str, Any] = field(default_factory=dict)


async def execute(key: RolloutKey, group_id: str, loaded: LoadedEnv, task: Task,
                  rs: RolloutSetup) -> PendingRollout:
    p = PendingRollout(key, group_id)
    try:
        p.session = await rs.link.open_session(group_id, key)
    except Exception as e:  # noqa: BLE001 - gateway down or refusing: infrastructure
        return p.fail("env_failure", f"gateway: cannot open a session: {type(e).__name__}: {e}")
    kind = "none" if loaded.manifest.sandbox.kind == "none" else rs.sandbox_kind
    tracker = SandboxTracker(rs.run_id, kind, loaded.folder)
    scratch = rs.scratch / f"{key.filename[:-5]}"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(run_id=rs.run_id, sandbox_kind=kind, open_sandbox=tracker.open,
                     scratch=scratch, options={"model": rs.model})
    try:
        await _run_phases(p, loaded, task, rs, ctx, tracker)
    except asyncio.CancelledError:
        if p.session is not None:  # interrupted mid-rollout: not the agent's fault, not scored
            await asyncio.shield(_close_quietly(p.session, "interrupted"))
        raise
    finally:
        await tracker.close_all()
    return p


async def _close_quietly(session: Any, reason: str) -> None:
    try:
        await session.aclose(status="env_failure", reason=reason)
    except Exception as e:  # noqa: BLE001 - best effort while shutting down
        log.warning("closing session %s failed: %s", getattr(session, "id", "?"), e)


async def _run_phases(p: PendingRollout, loaded: LoadedEnv, task: Task, rs: RolloutSetup,
                      ctx: RunContext, tracker: SandboxTracker) -> None:
    env, spec = loaded.env, loaded.manifest.sandbox
    t0 = time.monotonic()
    try:
        sandbox = await asyncio.wait_for(env.setup(task, ctx), spec.setup_timeout_s)
    except TimeoutError:
        p.fail("env_failure", f"setup timed out after {spec.setup_timeout_s:g}s")
        return
    except (EnvFailure, SandboxError) as e:
        p.fail("env_failure", f"setup: {type(e).__name__}: {e}")
        return
    # the environment's own code failed: not the agent's doing
    except Exception as e:  # noqa: BLE001
        p.fail("env_failure", f"setup crashed: {type(e).__name__}: {e}")
        return
    p.setup_s = time.monotonic() - t0

    limits = loaded.manifest.agent.model_copy(update=rs.limits_override)
    actx = AgentContext(task=task, env=env, sandbox=sandbox, run=ctx, limits=limits,
                        session=p.session, gateway_url=rs.link.url, model=rs.model)
    if not await _run_agent(p, rs.agent, actx, limits):
        return
    if not await _end_agent_processes(p, tracker.opened):
        return

    t2 = time.monotonic()
    try:
        verdict = await asyncio.wait_for(env.verify(task, sandbox, ctx), spec.setup_timeout_s)
    except TimeoutError:
        p.fail("env_failure", f"grading timed out after {spec.setup_timeout_s:g}s")
        return
    except Exception as e:  # noqa: BLE001 - grading that cannot complete is never a score of 0
        p.fail("env_failure", f"grading: {type(e).__name__}: {e}")
        return
    p.verify_s = time.monotonic() - t2
    if verdict.env_failure:
        p.fail("env_failure", f"grading: {verdict.env_failure}")
        return
    p.verdict = verdict


async def _end_agent_processes(p: PendingRollout, boxes: list[Sandbox]) -> bool:
    """Kill everything the agent phase left running in the rollout's sandboxes (a loop that
    rewrites the reward file, a server faking the answers) before anything is graded; False
    (env_failure) when a sandbox cannot be brought to that state."""
    for box in list(boxes):
        try:
            how = await box.end_processes()
        except (SandboxError, EnvFailure) as e:
            p.fail("env_failure", f"ending the agent's processes in {box.id}: {e}")
            return False
        p.agent_info.setdefault("ended_processes", {})[box.id] = how
    return True


async def _run_agent(p: PendingRollout, agent: Agent, actx: AgentContext,
                     limits: AgentLimits) -> bool:
    """Run the agent; False when the rollout already failed (no grading then)."""
    t1 = time.monotonic()
    try:
        result = await asyncio.wait_for(agent.run(actx), limits.time_limit_s + AGENT_GRACE_S)
        p.stopped, p.turns, p.agent_info = result.stopped, result.turns, result.info
    except TimeoutError:
        p.stopped = "time_limit"  # out of time is the agent's normal end: its work is graded
    except AgentError as e:
        p.fail("agent_error", str(e))
    except (EnvFailure, SandboxError) as e:
        p.fail("env_failure", f"during the agent: {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - any other crash of the agent itself
        p.fail("agent_error", f"agent crashed: {type(e).__name__}: {e}")
    p.duration_s = time.monotonic() - t1
    if p.status == "done" and p.stopped == "time_limit" and limits.time_limit_is_failure:
        p.fail("env_failure", f"time limit of {limits.time_limit_s:g}s reached: this "
               "environment's limits are in turns and tokens, so running out of wall-clock "
               "time means the machine was too slow (load), not the agent")
    return p.status == "done"
