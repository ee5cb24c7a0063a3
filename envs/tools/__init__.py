"""Agent tools: OpenAI-format schemas and one dispatcher that never raises on model mistakes.

    from envhub.envs.tools import ToolState, call_tool, tool_schemas
    tools = tool_schemas(["bash", "str_replace_editor", "search", "submit"])  # -> `tools=`
    state = ToolState()
    result = await call_tool(call.function.name, call.function.arguments, sandbox, state)
    # result.content -> the tool message; result.is_error -> process signal;
    # result.submitted -> end the rollout

Model mistakes (unknown tool, arguments that are not JSON or do not validate, a refused edit,
a timeout) come back as `ToolResult(is_error=True)` with a message saying how to call it
right. Infrastructure failures (`SandboxError` other than file errors: the sandbox died,
the engine went away) propagate, because they are env failures, not the model's fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from pydantic import BaseModel, ValidationError

from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxFileError
from envhub.envs.tools import bash, editor, search, submit
from envhub.envs.tools.result import ToolResult, ToolState
from envhub.envs.tools.truncation import cut_middle

__all__ = ["TOOL_NAMES", "ToolResult", "ToolState", "call_tool", "cut_middle", "tool_schemas"]

SCHEMAS: dict[str, dict[str, Any]] = {
    "bash": bash.SCHEMA,
    "str_replace_editor": editor.SCHEMA,
    "search": search.SCHEMA,
    "submit": submit.SCHEMA,
}
ARGS: dict[str, type[BaseModel]] = {
    "bash": bash.BashArgs,
    "str_replace_editor": editor.EditorArgs,
    "search": search.SearchArgs,
    "submit": submit.SubmitArgs,
}
TOOL_NAMES: tuple[str, ...] = tuple(SCHEMAS)


def tool_schemas(names: Iterable[str] = TOOL_NAMES) -> list[dict[str, Any]]:
    """OpenAI `tools=` entries for `names`; an unknown name raises ValueError (a config bug,
    e.g. a manifest's `tools` list, not a model mistake)."""
    unknown = [name for name in names if name not in SCHEMAS]
    if unknown:
        raise ValueError(f"unknown tool(s) {unknown}; available: {', '.join(TOOL_NAMES)}")
    return [json.loads(json.dumps(SCHEMAS[name])) for name in names]  # copies: callers may edit


def _parse(name: str, arguments: str | Mapping[str, Any] | None) -> BaseModel | ToolResult:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolResult(f"arguments for `{name}` are not valid JSON ({e.msg} at "
                              f"position {e.pos}); send one JSON object, e.g. "
                              f"{_example(name)}", is_error=True)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return ToolResult(f"arguments for `{name}` must be a JSON object, e.g. "
                          f"{_example(name)}", is_error=True)
    try:
        return ARGS[name].model_validate(dict(arguments))
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
            for err in e.errors())
        return ToolResult(f"bad arguments for `{name}`: {problems}. Expected parameters: "
                          f"{json.dumps(SCHEMAS[name]['function']['parameters']['properties'])}",
                          is_error=True)


def _example(name: str) -> str:
    return {
        "bash": '{"command": "ls"}',
        "str_replace_editor": '{"command": "view", "path": "main.py"}',
        "search": '{"pattern": "def main"}',
        "submit": "{}",
    }[name]


STATE_KEY = "envhub.tools"


def _tool_state(state: ToolState | MutableMapping[str, Any]) -> ToolState:
    """Callers may keep per-rollout state in a plain dict: ours lives under STATE_KEY."""
    if isinstance(state, ToolState):
        return state
    found = state.get(STATE_KEY)
    if not isinstance(found, ToolState):
        found = state[STATE_KEY] = ToolState()
    return found


async def call_tool(name: str, arguments: str | Mapping[str, Any] | None, sandbox: Sandbox,
                    state: ToolState | MutableMapping[str, Any],
                    timeout: float | None = None) -> ToolResult:
    """Run tool `name` with the model's `arguments` (a JSON string as sent in a tool call,
    or a dict). `state` is a ToolState, or a dict in which one is kept (and where
    `state["submitted"]` mirrors the submission). `timeout` is the default per-command limit
    (the sandbox spec's `exec_timeout_s` otherwise)."""
    tool_state = _tool_state(state)
    tool_state.calls += 1
    result = await _dispatch(name, arguments, sandbox, tool_state, timeout)
    if result.is_error:
        tool_state.errors += 1
    if not isinstance(state, ToolState):
        state["submitted"] = tool_state.submitted
    return result


async def _dispatch(name: str, arguments: str | Mapping[str, Any] | None, sandbox: Sandbox,
                    state: ToolState, timeout: float | None) -> ToolResult:
    if name not in SCHEMAS:
        return ToolResult(f"unknown tool `{name}`; available tools: {', '.join(TOOL_NAMES)}",
                          is_error=True)
    args = _parse(name, arguments)
    if isinstance(args, ToolResult):
        return args
    try:
        if isinstance(args, bash.BashArgs):
            return await bash.run_bash(args, sandbox, state, timeout)
        if isinstance(args, editor.EditorArgs):
            return await editor.run_editor(args, sandbox, state)
        if isinstance(args, search.SearchArgs):
            return await search.run_search(args, sandbox, state, timeout)
        assert isinstance(args, submit.SubmitArgs)
        return await submit.run_submit(args, state)
    except SandboxFileError as e:
        return ToolResult(str(e), is_error=True)
