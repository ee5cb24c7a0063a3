"""The tools one rollout offers: the environment's own (ToolProvider) first, then the shared
tools of `envhub.envs.tools` for the remaining names in `env.tools(task)`.

Every call returns a result for the model; nothing the model writes raises. `unknown` marks a
call to a tool that is not offered (a process signal).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from envhub.envs.environment import Environment, Task, ToolProvider, ToolResult
from envhub.envs.errors import EnvLoadError
from envhub.envs.sandbox.base import Sandbox


@dataclass
class CallOutcome:
    content: str
    is_error: bool
    submitted: bool
    unknown: bool = False


class Toolbox:
    def __init__(self, env: Environment, task: Task, sandbox: Sandbox) -> None:
        self.env, self.task, self.sandbox = env, task, sandbox
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

    async def call(self, name: str, arguments: str, state: dict[str, Any]) -> CallOutcome:
        if name in self.own:
            r: Any = await self.env.call_tool(  # type: ignore[attr-defined]
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
