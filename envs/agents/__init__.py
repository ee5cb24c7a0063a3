"""Agents: `tool` (built-in tool-calling, the default), `oracle` (gold solutions), `vf` (a
verifiers environment's own harness, the default and only agent besides `oracle` for those:
envs/verifiers; `agent_for` resolves an environment's agent) and any
command line (`--agent 'mini ...' --agent-install pip:mini-swe-agent`), which runs inside the
rollout's sandbox (boxed.py) unless `--agent-on-host` asks for a host process (command.py, no
containment, a loud warning). `make_agent` turns an `--agent` value into one."""

from __future__ import annotations

import logging
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from envhub.envs.agents.base import Agent, AgentContext, AgentResult
from envhub.envs.agents.boxed import BoxedCommandAgent
from envhub.envs.agents.command import CommandAgent
from envhub.envs.agents.oracle import OracleAgent
from envhub.envs.agents.tool_calling import ToolCallingAgent
from envhub.envs.errors import AgentSpecError, RunConfigError

DEFAULT_AGENT = "tool"  # for environments that bring no agent of their own (OwnAgent)
OWN_AGENTS = ("vf",)  # agents that are an environment's own (only for those environments)
BUILTIN_AGENTS = ("tool", "tool:drop", "tool:summarize", "tool:required", "oracle", *OWN_AGENTS)
ON_HOST_WARNING = ("envhub: WARNING: --agent-on-host: the command agent runs as a process on "
                   "THIS MACHINE with your user's rights (docker socket, other rollouts' files, "
                   "task data and gold patches, loopback services): no containment, rewards "
                   "can be forged. Drop --agent-on-host to run it inside the sandbox.")
log = logging.getLogger(__name__)


def make_agent(spec: str | None, installs: list[str] | None = None,
               on_host: bool = False) -> Agent:
    """`None`/`tool` → built-in agent (context strategy `drop`; `tool:summarize` to
    summarize; `tool:required` to have every reply constrained to a tool call); `oracle`;
    anything else is a command line: run inside the rollout's sandbox with `installs`
    (--agent-install specs) made present there, or with `on_host` a host process whose program
    must exist here."""
    spec = (spec or "tool").strip()
    if (installs or on_host) and spec in BUILTIN_AGENTS:
        raise AgentSpecError("--agent-install and --agent-on-host are for command-line agents, "
                             f"not {spec!r}")
    if installs and on_host:
        raise AgentSpecError("--agent-install makes an agent present inside the sandbox; with "
                             "--agent-on-host install it on this machine instead")
    if spec in ("tool", "tool:drop"):
        return ToolCallingAgent(context="drop")
    if spec == "tool:summarize":
        return ToolCallingAgent(context="summarize")
    if spec == "tool:required":
        return ToolCallingAgent(context="drop", tool_choice="required")
    if spec == "oracle":
        return OracleAgent()
    if spec == "vf":  # a verifiers environment's own harness (envs/verifiers)
        from envhub.envs.verifiers.agent import VerifiersAgent

        return VerifiersAgent()
    if not on_host:
        boxed = BoxedCommandAgent(spec, installs)
        if not installs and len(boxed.argv) == 1 and shutil.which(spec) is None:
            raise AgentSpecError(  # a lone unknown word is a typo far more often than a program
                f"unknown agent {shlex.quote(spec)}: not one of {', '.join(BUILTIN_AGENTS)}; a "
                "command line runs inside the sandbox: give --agent-install pip:PKG|script:PATH "
                "for its program, or --agent-on-host")
        return boxed
    log.warning(ON_HOST_WARNING)
    print(ON_HOST_WARNING, file=sys.stderr, flush=True)
    agent = CommandAgent(spec)
    program = agent.argv[0]
    if shutil.which(program) is None and not Path(program).is_file():
        raise AgentSpecError(
            f"unknown agent {shlex.quote(spec)}: not one of {', '.join(BUILTIN_AGENTS)} and "
            f"{program!r} is not a program on PATH; install it or give its path")
    return agent


@runtime_checkable
class OwnAgent(Protocol):
    """An environment that brings its own agent (verifiers: their harness): its rollouts run
    `default_agent` unless --agent names another of `agents`, the only ones that can act on it
    (envhub's tool-calling agent has nothing to call there)."""

    default_agent: str
    agents: tuple[str, ...]


def agent_for(spec: str | None, env: Any, env_name: str = "") -> str:
    """The --agent value `env`'s rollouts run: `spec` when given, else the environment's own
    agent (`tool` for one that brings none). RunConfigError (exit 2, with the fix) when `spec`
    cannot act on `env`. The one resolution `envhub run`, `train`, task services and Ray nodes
    share."""
    spec = spec.strip() if spec else None
    what = f"{env_name}: " if env_name else ""
    if isinstance(env, OwnAgent):
        if spec is None:
            return env.default_agent
        if spec not in env.agents:
            raise RunConfigError(
                f"{what}--agent {spec} cannot act on this environment, which brings its own "
                f"agent: drop --agent (it runs {env.default_agent}), or give one of "
                f"{', '.join(env.agents)}; run other environments with another agent in a "
                "run of their own")
        return spec
    if spec in OWN_AGENTS:
        raise RunConfigError(f"{what}--agent {spec} runs a verifiers environment's own harness; "
                             "this environment is not one: drop --agent or give another")
    return spec or DEFAULT_AGENT


def agents_for(spec: str | None, envs: Mapping[str, Any]) -> dict[str, str]:
    """`agent_for` of each environment (by its key in `envs`: name or reference)."""
    return {key: agent_for(spec, env, key) for key, env in envs.items()}


def make_agents(specs: Mapping[str, str], installs: list[str] | None = None,
                on_host: bool = False) -> dict[str, Agent]:
    """One agent per distinct spec, shared by the environments (keys of `specs`) that run it."""
    made = {spec: make_agent(spec, installs, on_host) for spec in set(specs.values())}
    return {key: made[spec] for key, spec in specs.items()}


__all__ = [
    "BUILTIN_AGENTS",
    "DEFAULT_AGENT",
    "Agent",
    "AgentContext",
    "AgentResult",
    "BoxedCommandAgent",
    "CommandAgent",
    "OracleAgent",
    "OwnAgent",
    "ToolCallingAgent",
    "agent_for",
    "agents_for",
    "make_agent",
    "make_agents",
]
