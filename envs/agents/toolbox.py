"""The tools one rollout offers: the environment's own (ToolProvider) first, then the shared
tools of `envhub.envs.tools` for the remaining names in `env.tools(task)`, then, once `start`
ran, the tools of the environment's own MCP servers (`[mcp.NAME]`, envs/mcp/client.py; a
toolbox that starts them must `aclose`).

Every call returns a result for the model; nothing the model writes raises. `unknown` marks a
call to a tool that is not offered (a process signal).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.envs.environment import EnvFailure, Environment, Task, ToolProvider, ToolResult
from envhub.envs.errors import EnvLoadError
from envhub.envs.sandbox.base import Sandbox

if TYPE_CHECKING:
    from envhub.envs.mcp.client import McpTools


@dataclass
class CallOutcome:
    content: str
    is_error: bool
    submitted: bool
    unknown: bool = False


class Toolbox:
    def __init__(self, env: Environment, task: Task, sandbox: Sandbox,
                 package_root: Path | None = None) -> None:
        self.env, self.task, self.sandbox = env, task, sandbox
        self.package_root = package_root  # where `[mcp.NAME] files` are found
        self.mcp: McpTools | None = None
        names = list(env.tools(task))
        self.own: dict[str, dict[str, Any]] = {}
        if isinstance(env, ToolProvider):
            for schema in env.tool_schemas(task):
                self.own[schema["function"]["name"]] = schema
        shared_names = [n for n in names if n not in self.own]
        self.shared: dict[str, dict[str, Any]] = _shared_schemas(shared_names)
        self.schemas = [self.own.get(n) or self.shared[n] for n in names]

    @property
    def names(self) -> list[str]:
        return [s["function"]["name"] for s in self.schemas]

    async def start(self) -> None:
        """Start the environment's MCP servers inside the sandbox and offer their tools
        (EnvFailure when one cannot start: nothing the agent did yet)."""
        if not self.env.manifest.mcp or self.mcp is not None:
            return
        from envhub.envs.mcp.client import McpTools

        self.mcp = McpTools(self.env.manifest, self.sandbox, self.package_root)
        await self.mcp.start()
        taken = [n for n in self.mcp.tools if n in self.names]
        if taken:
            raise EnvFailure(f"envhub.toml: MCP tool {taken[0]!r} has the name of another "
                             "tool; give its [mcp] server a `prefix`")
        self.schemas += self.mcp.schemas

    async def aclose(self) -> None:
        """Stop the MCP servers (safe to call twice, or without `start`)."""
        if self.mcp is not None:
            await self.mcp.aclose()

    async def call(self, name: str, arguments: str, state: dict[str, Any]) -> CallOutcome:
        if self.mcp is not None and name in self.mcp:
            r: Any = await self.mcp.call(name, arguments)
        elif name in self.own:
            r = await self.env.call_tool(  # type: ignore[attr-defined]
                self.task, name, arguments, self.sandbox, state)
        elif name in self.shared:
            tools = importlib.import_module("envhub.envs.tools")
            r = await tools.call_tool(name, arguments, self.sandbox, state)
        else:
            offered = ", ".join(self.names)
            return CallOutcome(f"unknown tool {name!r}; the tools are: {offered}",
                               is_error=True, submitted=False, unknown=True)
        return CallOutcome(str(r.content), bool(r.is_error), bool(getattr(r, "submitted", False)))


def _shared_schemas(names: list[str]) -> dict[str, dict[str, Any]]:
    if not names:
        return {}
    from envhub.envs.tools import tool_schemas

    try:
        return {s["function"]["name"]: s for s in tool_schemas(names)}
    except ValueError as e:
        raise EnvLoadError(f"envhub.toml: field 'tools': {e}; or define the tool in the "
                           "environment (tool_schemas/call_tool)") from None


__all__ = ["CallOutcome", "ToolResult", "Toolbox"]
