"""Agents: `tool` (built-in tool-calling, the default), `oracle` (gold solutions) and any
command line (`--agent 'mini ...' --agent-install pip:mini-swe-agent`), which runs inside the
rollout's sandbox (boxed.py) unless `--agent-on-host` asks for a host process (command.py, no
containment, a loud warning). `make_agent` turns an `--agent` value into one."""

from __future__ import annotations

import logging
import shlex
import shutil
import sys
from pathlib import Path

from envhub.envs.agents.base import Agent, AgentContext, AgentResult
from envhub.envs.agents.boxed import BoxedCommandAgent
from envhub.envs.agents.command import CommandAgent
from envhub.envs.agents.oracle import OracleAgent
from envhub.envs.agents.tool_calling import ToolCallingAgent
from envhub.envs.errors import AgentSpecError

BUILTIN_AGENTS = ("tool", "tool:drop", "tool:summarize", "tool:required", "oracle")
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


__all__ = [
    "BUILTIN_AGENTS",
    "Agent",
    "AgentContext",
    "AgentResult",
    "BoxedCommandAgent",
    "CommandAgent",
    "OracleAgent",
    "ToolCallingAgent",
    "make_agent",
]
