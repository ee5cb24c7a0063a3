"""Tool calls parsed from sampled text, one parser per model family.

A parser never raises: output it cannot parse comes back as plain content with
`malformed=True`, which the gateway records as a `process` signal.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass
class ParsedCompletion:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {'name', 'arguments': str}
    malformed: str | None = None  # why the tool call could not be parsed


def _call(name: Any, args: Any) -> dict[str, Any] | None:
    if not isinstance(name, str) or not name:
        return None
    if isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    try:
        return {"name": name, "arguments": orjson.dumps(args).decode()}
    except orjson.JSONEncodeError:  # nested deeper than orjson writes (254 levels): unusable
        return None


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


def parse_hermes(text: str) -> ParsedCompletion:
    """Hermes / Qwen: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`."""
    start = text.find("<tool_call>")
    if start < 0:
        return ParsedCompletion(content=text)
    calls = []
    for m in _HERMES.finditer(text, start):
        body = m.group(1).strip()
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return ParsedCompletion(content=text, malformed="tool call body is not valid JSON")
        call = _call(obj.get("name"), obj.get("arguments", {})) if isinstance(obj, dict) else None
        if call is None:
            return ParsedCompletion(
                content=text, malformed="tool call needs a string 'name' and object 'arguments'")
        calls.append(call)
    content = text[:start].strip() or None
    return ParsedCompletion(content=content, tool_calls=calls)


_DS_BEGIN = "<｜tool▁calls▁begin｜>"
_DS_CALL = re.compile(
    r"<｜tool▁call▁begin｜>(?:function)?<｜tool▁sep｜>(?P<name>[^\n]*)\n```(?:json)?\n"
    r"(?P<args>.*?)\n```<｜tool▁call▁end｜>", re.S)


def parse_deepseek(text: str) -> ParsedCompletion:
    """DeepSeek-V3: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json ARGS```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`."""
    start = text.find(_DS_BEGIN)
    if start < 0:
        return ParsedCompletion(content=text)
    matches = list(_DS_CALL.finditer(text, start))
    if not matches:
        return ParsedCompletion(content=text, malformed="tool call block without a valid call")
    calls = []
    for m in matches:
        call = _call(m.group("name").strip(), m.group("args"))
        if call is None:
            return ParsedCompletion(content=text, malformed="tool call arguments are not a JSON "
                                                            "object")
        calls.append(call)
    return ParsedCompletion(content=text[:start].strip() or None, tool_calls=calls)


def parse_none(text: str) -> ParsedCompletion:
    return ParsedCompletion(content=text)


PARSERS: dict[str, Callable[[str], ParsedCompletion]] = {
    "hermes": parse_hermes,
    "deepseek": parse_deepseek,
    "none": parse_none,
}


def detect_format(chat_template: str) -> str:
    if "<tool_call>" in chat_template:
        return "hermes"
    if "tool▁calls▁begin" in chat_template:
        return "deepseek"
    return "none"
