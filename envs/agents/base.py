"""The Agent contract: one rollout's worth of work on a prepared sandbox.

Agents talk to the model only through their gateway session, so every model call is recorded.
Failure mapping (the runner relies on it): raise `AgentError` for the agent's own failures
(→ `agent_error`), `EnvFailure` or a `SandboxError` for infrastructure (→ `env_failure`);
running out of turns, tokens or time is a normal end (the work is still graded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from envhub.envs.environment import Environment, RunContext, Task
from envhub.envs.manifest import AgentLimits
from envhub.envs.sandbox.base import Sandbox


@dataclass
class AgentContext:
    task: Task
    env: Environment
    sandbox: Sandbox
    run: RunContext
    limits: AgentLimits
    session: Any  # envhub.sdk.AsyncSession; None only for agents that never call a model
    gateway_url: str  # root URL, no /v1
    model: str = "default"
    state: dict[str, Any] = field(default_factory=dict)  # shared with the tools (submission, ...)
    sample: int = 0  # this rollout's index among its task's samples in the group
    package_root: Path | None = None  # the environment's folder (its [mcp] servers' files)


@dataclass
class AgentResult:
    stopped: str  # submitted | finished | max_turns | max_tokens | time_limit | solved | exited
    turns: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class Agent(Protocol):
    name: str

    async def run(self, ctx: AgentContext) -> AgentResult: ...
