"""Reading a tool call's arguments (JSON text as the model wrote it) for environment-defined
tools: a JSON object, or an error result that says how to call the tool right."""

from __future__ import annotations

import json
from typing import Any

from envhub.envs.tools.result import ToolResult


def json_object(name: str, arguments: str | None, example: str) -> dict[str, Any] | ToolResult:
    """The arguments as a dict; a ToolResult(is_error=True) naming `example` otherwise."""
    try:
        value = json.loads(arguments) if arguments and arguments.strip() else {}
    except json.JSONDecodeError as e:
        return ToolResult(f"arguments for `{name}` are not valid JSON ({e.msg}); send one JSON "
                          f"object, e.g. {example}", is_error=True)
    if not isinstance(value, dict):
        return ToolResult(f"arguments for `{name}` must be a JSON object, e.g. {example}",
                          is_error=True)
    return value
