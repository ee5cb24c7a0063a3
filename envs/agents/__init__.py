"""Agents: `tool` (built-in tool-calling, the default), `oracle` (gold solutions) and any
command line (`--agent 'python agent.py'`). `make_agent` turns an `--agent` value into one."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from envhub.envs.agents.base import Agent, AgentContext, AgentResult
from envhub.envs.agents.command import CommandAgent
from envhub.envs.agents.oracle import OracleAgent
from envhub.envs.agents.tool_calling import ToolCallingAgent
from envhub.envs.errors import AgentSpecError

BUILTIN_AGENTS = ("tool", "tool:drop", "tool:summarize", "oracle")


def make_agent(spec: str | None) -> Agent:
    """`None`/`tool` → built-in agent (context strategy `drop`; `tool:summarize` to
    summarize); `oracle`; anything else is a command line whose program must exist."""
    spec = (spec or "tool").strip()
    if spec in ("tool", "tool:drop"):
        return ToolCallingAgent(context="drop")
    if spec == "tool:summarize":
        return ToolCallingAgent(context="summarize")
    if spec == "oracle":
        return OracleAgent()
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
    "CommandAgent",
    "OracleAgent",
    "ToolCallingAgent",
    "make_agent",
]
