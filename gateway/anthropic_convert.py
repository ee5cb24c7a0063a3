"""Anthropic request → the gateway's chat form: content blocks to OpenAI-shaped messages,
client tools to function tools, tool_choice to the tools rendered and the sampling constraint.
Each error names the block it is about (`messages[1].content[0]`), in Anthropic's terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from envhub.gateway.errors import BadRequest
from envhub.gateway.strict import strict_schema
from envhub.gateway.structured import Constraint, for_request

_JOIN = "\n\n"  # between text blocks of one message (a single block stays byte-exact)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Anthropic content: a string is one text block; otherwise a non-empty list of blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise BadRequest(f"{where}.content must be a string or a list of content blocks "
                         "({'type': 'text', 'text': ...}, ...)", param=where)
    return content


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text must be a string", param=where)
    return text


def _unsupported(kind: Any, where: str, allowed: str) -> BadRequest:
    return BadRequest(f"{where}: content block type {kind!r} is not supported here; use "
                      f"{allowed} (this gateway serves text models)", param=where)


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    use_id = block.get("tool_use_id")
    if not isinstance(use_id, str) or not use_id:
        raise BadRequest(f"{where}.tool_use_id must be the id of the tool_use it answers",
                         param=where)
    content = block.get("content")
    if content is None:
        content = ""
    parts = []
    for j, part in enumerate(_blocks(content, where) if content != "" else []):
        if part.get("type") != "text":
            raise _unsupported(part.get("type"), f"{where}.content[{j}]", "text blocks")
        parts.append(_text(part, f"{where}.content[{j}]"))
    text = _JOIN.join(parts)
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise BadRequest(f"{where}.is_error must be a boolean", param=where)
    if is_error:
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": use_id, "content": text}


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """tool_result blocks → tool messages (in order), then the text → one user message."""
    tools: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "tool_result":
            if texts:  # Anthropic's rule too: results answer the turn before anything new
                raise BadRequest(f"{at}: tool_result blocks must come before any text in a "
                                 "user message", param=at)
            tools.append(_tool_result(block, at))
        elif kind == "text":
            texts.append(_text(block, at))
        else:
            raise _unsupported(kind, at, "'text' or 'tool_result'")
    out = tools
    if texts or not tools:
        out.append({"role": "user", "content": _JOIN.join(texts)})
    return out


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """text + tool_use blocks → one assistant message with `tool_calls` (input as arguments)."""
    texts, thinking, calls = [], [], []
    for j, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            uid, name, args = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(uid, str) or not isinstance(name, str) or not name \
                    or not isinstance(args, dict):
                raise BadRequest(f"{at} needs {{'type': 'tool_use', 'id': str, 'name': str, "
                                 "'input': {...}}", param=at)
            calls.append({"id": uid, "type": "function",
                          "function": {"name": name,
                                       "arguments": orjson.dumps(args).decode()}})
        elif kind == "thinking":
            if isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
        elif kind != "redacted_thinking":  # opaque to us: nothing to render
            raise _unsupported(kind, at, "'text', 'tool_use' or 'thinking'")
    msg: dict[str, Any] = {"role": "assistant", "content": _JOIN.join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = _JOIN.join(thinking)
    return msg


def _system(raw: Any) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw or None
    blocks = _blocks(raw, "system")
    for j, b in enumerate(blocks):
        if b.get("type") != "text":
            raise _unsupported(b.get("type"), f"system[{j}]", "text blocks")
    return _JOIN.join(_text(b, f"system[{j}]") for j, b in enumerate(blocks)) or None


def to_messages(system: Any, raw: Any) -> list[dict[str, Any]]:
    """Anthropic `system` + `messages` → OpenAI-shaped chat messages, validated; the OpenAI
    route's `normalize_message` then gives the exact form that is hashed and rendered."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list of {'role': 'user' | "
                         "'assistant', 'content': ...}", param="messages")
    out: list[dict[str, Any]] = []
    text = _system(system)
    if text is not None:
        out.append({"role": "system", "content": text})
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise BadRequest(f"{where}.role is {role!r}; use 'user' or 'assistant' (the "
                             "system prompt goes in the top-level 'system' field)", param=where)
        if "content" not in m:
            raise BadRequest(f"{where}.content is required", param=where)
        if role == "system":  # mid-conversation instructions (Claude Code sends them, and
            # after its /compact an empty one): rendered in place, as sent
            if i == 0:
                raise BadRequest(f"{where}: a 'system' message comes after the first message "
                                 "(the system prompt goes in the top-level 'system' field)",
                                 param=where)
            out.append({"role": "system", "content": _system(m["content"]) or ""})
            continue
        blocks = _blocks(m["content"], where)
        if role == "user":
            if not blocks:
                raise BadRequest(f"{where}.content must not be empty", param=where)
            out += _user(blocks, where)
        else:
            out.append(_assistant(blocks, where))
    if raw[-1].get("role") == "assistant":
        raise BadRequest("the last message is from the assistant (a prefill); this gateway "
                         "cannot continue a closed assistant turn: end with a user message",
                         param="messages")
    return out


def to_tools(raw: Any) -> list[dict[str, Any]] | None:
    """Anthropic tools ({name, description, input_schema, strict}) → OpenAI function tools."""
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise BadRequest("'tools' must be a list of {'name', 'description', 'input_schema'}",
                         param="tools")
    out = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise BadRequest(f"{where}: only client tools ({{'name', 'description', "
                             f"'input_schema'}}) are supported, not {kind!r}", param=where)
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not 0 < len(name) <= 64 or not all(
                c.isalnum() or c in "_-" for c in name):
            raise BadRequest(f"{where}.name must be 1-64 chars of a-z, A-Z, 0-9, _ or -",
                             param=where)
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise BadRequest(f"{where}.input_schema must be a JSON Schema object "
                             "({'type': 'object', 'properties': {...}})", param=where)
        fn: dict[str, Any] = {"name": name}
        if tool.get("description") is not None:
            if not isinstance(tool["description"], str):
                raise BadRequest(f"{where}.description must be a string", param=where)
            fn["description"] = tool["description"]
        fn["parameters"] = schema
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise BadRequest(f"{where}.strict must be a JSON boolean", param=where)
        if strict:  # strict tool use: the call's input must match input_schema (strict.py)
            fn["strict"] = True
        out.append({"type": "function", "function": fn})
    return out


def tool_choice(raw: Any, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if raw is None:
        return tools
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise BadRequest("'tool_choice' must be {'type': 'auto' | 'any' | 'none'} or "
                         "{'type': 'tool', 'name': ...}", param="tool_choice")
    if kind == "none":
        return None
    if kind == "tool":
        names = {t["function"]["name"] for t in tools or []}
        if raw.get("name") not in names:
            raise BadRequest(f"tool_choice names {raw.get('name')!r}, which is not in 'tools'",
                             param="tool_choice")
    return tools


@dataclass(frozen=True)
class JsonOutput:
    """JSON outputs as OpenAI's strict response_format (`fmt`), and the field it came from."""

    fmt: dict[str, Any]
    param: str  # output_config.format, or the beta's output_format


def json_output(config: dict[str, Any] | None, beta: dict[str, Any] | None
                ) -> JsonOutput | None:
    """JSON outputs (`output_config.format`, or the structured-outputs beta's `output_format`)
    as OpenAI's strict response_format: Anthropic's JSON outputs follow the schema exactly, so
    its objects are closed and every property required (gateway/strict.py; the closed schema is
    also what a hosted model is sent)."""
    fmt, where = (config or {}).get("format"), "output_config.format"
    if beta is not None:
        if fmt is not None:
            raise BadRequest("send the JSON output schema once: output_config.format or "
                             "output_format, not both", param="output_format")
        fmt, where = beta, "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(
            fmt.get("schema"), dict):
        raise BadRequest(f"{where} must be {{'type': 'json_schema', 'schema': {{...}}}}",
                         param=where)
    try:
        schema = strict_schema(fmt["schema"], "the output schema", where)
    except BadRequest as e:  # no strict flag to turn off here
        e.message = e.message.replace(", or send strict false", "")
        raise
    except RecursionError:
        raise BadRequest("the output schema nests too deeply; flatten it", param=where) from None
    return JsonOutput({"type": "json_schema", "json_schema": {
        "name": "output", "schema": schema, "strict": True}}, where)


def constraint(renderer: Any, choice: Any, tools: list[dict[str, Any]] | None,
               output: JsonOutput | None = None) -> Constraint | None:
    """`any` / `tool` force a tool call; `disable_parallel_tool_use` allows at most one;
    `output` (json_output) constrains the answer to its schema."""
    # what a hosted model (litellm, OpenAI-shaped) takes for the same request
    request: dict[str, Any] = {}
    force, name, single = None, None, False
    if isinstance(choice, dict) and tools:
        single = choice.get("disable_parallel_tool_use", False)
        if not isinstance(single, bool):
            raise BadRequest("'tool_choice.disable_parallel_tool_use' must be a JSON boolean",
                             param="tool_choice.disable_parallel_tool_use")
        force = {"any": "required", "tool": "named"}.get(choice["type"])
        name = choice.get("name")
        request["parallel_tool_calls"] = not single
        if force == "required":
            request["tool_choice"] = "required"
        elif force == "named":
            request["tool_choice"] = {"type": "function", "function": {"name": name}}
    if output is not None:
        request["response_format"] = output.fmt
    if not request:
        return None
    try:
        return for_request(renderer, tools, fmt=output.fmt if output else None, force=force,
                           name=name, parallel=not single, request=request)
    except BadRequest as e:  # name the Anthropic field, not the chat one
        if e.param and e.param.startswith("response_format") and output is not None:
            e.param = output.param
            e.message = e.message.replace("response_format's schema", "the output schema")
        raise
