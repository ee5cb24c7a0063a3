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
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.envs.agents.base import Agent, AgentContext
from envhub.envs.environment import (
    UNGRADABLE,
    EnvFailure,
    GradingBudget,
    RunContext,
    Task,
    Verdict,
)
from envhub.envs.errors import AgentError, AgentOutputError
from envhub.envs.loader import LoadedEnv
from envhub.envs.manifest import AgentLimits, SandboxSpec
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxError
from envhub.orchestrator.groups.memory_sandbox import MemorySandbox
from envhub.orchestrator.groups.plan import RolloutKey
from envhub.sdk.types import Signal

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
    node: dict[str, str] = field(default_factory=dict)  # where it ran (--executor ray)
    signals: list[Signal] = field(default_factory=list)  # held by a run elsewhere, to post

    def fail(self, status: str, reason: str) -> PendingRollout:
        self.status, self.reason = status, reason[:2000]
        return self


class SandboxTracker:
    """Opens the rollout's sandboxes (the environment may open several) and closes them all."""

    def __init__(self, run_id: str, kind: str, package_root: Path) -> None:
        self.run_id, self.kind, self.package_root = run_id, kind, package_root
        self.opened: list[Sandbox] = []
        # An in-sandbox agent's hook: sandboxes opened before the agent phase get its layer and
        # channel; cleared when the phase ends, so grading sandboxes never do.
        self.agent_box: AgentBox | None = None

    async def open(self, spec: SandboxSpec) -> Sandbox:
        if spec.kind == "none" or self.kind == "none":
            box: Sandbox = MemorySandbox()
        else:
            box = await self.open_kind(self.kind, spec)
        self.opened.append(box)
        return box

    async def open_kind(self, kind: str, spec: SandboxSpec) -> Sandbox:
        from envhub.envs.sandbox import open_sandbox

        binds = None
        if self.agent_box is not None:
            spec, binds = await self.agent_box.adapt(kind, spec, self.package_root)
        return await open_sandbox(kind, spec, run_id=self.run_id, package_root=self.package_root,
                                  binds=binds)

    async def close_all(self) -> None:
        while self.opened:
            box = self.opened.pop()
            try:
                await asyncio.shield(box.close())
            # closing must not mask the rollout's result; reap() at the end of the run follows
            except Exception as e:  # noqa: BLE001
                log.warning("closing sandbox %s failed: %s", getattr(box, "id", "?"), e)


class AgentBox:
    """One rollout's in-sandbox agent: its channel (host end) and how its sandbox is adapted."""

    def __init__(self, agent: Any, channel: Any) -> None:
        self.agent, self.channel = agent, channel

    async def adapt(self, kind: str, spec: SandboxSpec, root: Path
                    ) -> tuple[SandboxSpec, dict[str, str]]:
        image = None
        if kind == "docker":
            from envhub.envs.images import aimage_for_spec

            image = await aimage_for_spec(spec.image, spec.dockerfile, root)
        layered, binds = await self.agent.sandbox_options(kind, image, self.channel.folder)
        if layered is not None:
            spec = spec.model_copy(update={"image": layered, "dockerfile": None})
        return spec, binds


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
    metrics: Any = None  # TaskMetrics of the run (task_metrics.py), when something serves them
    agent_kind: str | None = None  # where an in-sandbox agent runs when the env has no sandbox
    agent_install: list[str] = field(default_factory=list)  # to rebuild the agent on a node
    agent_on_host: bool = False


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
    channel = None
    try:
        if getattr(rs.agent, "in_sandbox", False):
            from envhub.envs.agents.channel import SessionChannel

            try:
                channel = await SessionChannel(rs.scratch / f"ch-{secrets.token_hex(4)}",
                                               rs.link.url, str(p.session.api_key)).start()
            except (OSError, ValueError) as e:  # the host end cannot serve: infrastructure
                return p.fail("env_failure", f"agent channel: {type(e).__name__}: {e}")
            tracker.agent_box = AgentBox(rs.agent, channel)
        await _run_phases(p, loaded, task, rs, ctx, tracker)
    except asyncio.CancelledError:
        if p.session is not None:  # interrupted mid-rollout: not the agent's fault, not scored
            await asyncio.shield(_close_quietly(p.session, "interrupted"))
        raise
    finally:
        await tracker.close_all()
        if channel is not None:
            await channel.close()
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
                        session=p.session, gateway_url=rs.link.url, model=rs.model,
                        sample=p.key.sample, package_root=loaded.folder)
    if tracker.agent_box is not None:
        if not await _agent_sandbox(p, actx, tracker, rs):
            return
        actx.state["channel"] = tracker.agent_box.channel
        if not await _serve_tools(p, loaded, task, sandbox, actx, tracker.agent_box.channel):
            return
    agent_ok = await _run_agent(p, rs.agent, actx, limits)
    # asked with the session's own key: a proxy in front of several gateways routes by it,
    # so the question reaches the process that served (and counted) the agent's calls
    refused, why = await rs.link.pool_refusals(p.session.id, str(p.session.api_key))
    if refused:  # the agent's calls were refused for the pool's fault: whatever it did then,
        # its end (a crash, a give-up, a worse answer) is not its own, and it is not graded
        p.fail("env_failure", f"the data pool could not record {refused} of the agent's "
               f"calls ({why or 'pool unavailable'}); the gateway answered them 503")
        agent_ok = False
    tracker.agent_box = None  # sandboxes opened from now on (grading) get no agent channel
    channel = actx.state.get("channel")
    if channel is not None:
        await channel.close()  # the agent's way out is gone before grading
        # an agent denied its tools may have failed for that alone: not its grade either way
        if channel.mcp_unavailable_hits and p.status != "env_failure":
            p.fail("env_failure", "the agent asked for the environment's tools over MCP, which "
                   f"could not be served: {channel.mcp_unavailable}")
            return
    if not agent_ok:
        return
    if not await _end_agent_processes(p, tracker.opened):
        return

    t2 = time.monotonic()
    budget = spec.setup_timeout_s
    if isinstance(env, GradingBudget):  # a grader that may retry and run a control
        budget = max(budget, env.verify_budget_s(task))
    try:
        verdict = await asyncio.wait_for(env.verify(task, sandbox, ctx), budget)
    except TimeoutError:
        p.fail("env_failure", f"grading timed out after {budget:g}s")
        return
    except AgentOutputError as e:  # the agent's output is what cannot be graded: 0, not dropped
        verdict = Verdict(0.0, False, {"ungradable": str(e)},
                          signals=[Signal(name=UNGRADABLE, info={"error": str(e)})])
    except Exception as e:  # noqa: BLE001 - grading that cannot complete is never a score of 0
        p.fail("env_failure", f"grading: {type(e).__name__}: {e}")
        return
    p.verify_s = time.monotonic() - t2
    if verdict.env_failure:
        p.fail("env_failure", f"grading: {verdict.env_failure}")
        return
    p.verdict = verdict


async def _agent_sandbox(p: PendingRollout, actx: AgentContext, tracker: SandboxTracker,
                         rs: RolloutSetup) -> bool:
    """An environment without a sandbox (kind none) still gets one for an in-sandbox agent:
    opened here from the default spec, closed with the rollout's others."""
    if getattr(actx.sandbox, "kind", None) in ("docker", "local"):
        return True
    try:
        box = await tracker.open_kind(rs.agent_kind or "auto", SandboxSpec())
    except Exception as e:  # noqa: BLE001 - cannot host the agent: infrastructure
        p.fail("env_failure", f"opening the agent's sandbox: {type(e).__name__}: {e}")
        return False
    tracker.opened.append(box)
    actx.sandbox = box
    return True


async def _serve_tools(p: PendingRollout, loaded: LoadedEnv, task: Task, sandbox: Sandbox,
                       actx: AgentContext, channel: Any) -> bool:
    """The environment's tools served over MCP on the in-sandbox agent's channel
    (envs/mcp/server.py), dispatched as the built-in agent does: against the sandbox `setup`
    returned (not the agent's own when the environment has none), with the agent context's
    state (what the agent submits there is what `verify` reads), the environment's own `[mcp]`
    servers started as for the built-in agent (one that cannot start: env_failure). Without
    tools `/mcp` answers 404. Tools that cannot be served here (the MCP SDK missing or too
    old, the environment's tool schemas crashing): `/mcp` answers 503 with the reason, and an
    agent that asked for them ends as env_failure (`_run_phases`), never as a silent 0.
    False when the rollout failed."""
    from envhub.envs.agents.toolbox import Toolbox
    from envhub.envs.mcp.client import McpMissing
    from envhub.envs.mcp.server import ToolServer

    try:
        toolbox = Toolbox(loaded.env, task, sandbox, actx.package_root)
    except Exception as e:  # noqa: BLE001 - the agent may not need them: said at /mcp (503)
        return _no_tools(loaded, channel, f"{type(e).__name__}: {e}")
    # the agent shares the tools' sandbox: what fails there may be its doing (server.py)
    server = ToolServer(toolbox, actx.state, actx.session, shared=sandbox is actx.sandbox)
    try:
        await server.start()
    except McpMissing as e:
        await server.close()
        return _no_tools(loaded, channel, str(e))
    except (EnvFailure, SandboxError) as e:
        await server.close()
        p.fail("env_failure", f"the environment's tools: {type(e).__name__}: {e}")
        return False
    except Exception as e:  # noqa: BLE001 - the SDK failed to start: said at /mcp (503)
        await server.close()
        return _no_tools(loaded, channel, f"{type(e).__name__}: {e}")
    if server.toolbox.schemas:
        channel.serve_mcp(server)
    else:
        await server.close()
    return True


def _no_tools(loaded: LoadedEnv, channel: Any, reason: str) -> bool:
    log.warning("%s: not serving its tools over MCP: %s", loaded.manifest.name, reason)
    channel.refuse_mcp(reason)
    return True


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
