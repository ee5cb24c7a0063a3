"""Anthropic Messages API: POST /v1/messages (+SSE) and POST /v1/messages/count_tokens.

Requests are converted to the same normalised messages as the OpenAI route and go through the
same ChatService turn (plan → render → engine → parse → record), so an Anthropic-speaking agent
is as token-exact as an OpenAI one. The conversion is chosen so that the assistant message a
client echoes back (our `content` blocks, unchanged) hashes exactly like the response we
recorded: its text blocks joined = the parsed content, its `tool_use` inputs = the parsed
arguments. The next request then extends the token history instead of starting a new segment.

Decisions where the Anthropic API and token-exactness meet:
- Text that ended on a stop sequence keeps the stop sequence (Anthropic drops it): the sampled
  tokens are the record, and an echo without them would no longer extend the history.
- `stop_reason: "stop_sequence"` is set when the engine reports the stop string that ended the
  completion (the embedded engine does), else when the completion finished without an EOS id
  and one of `stop_sequences` occurs in its last tokens (the latest-ending one is reported).
- A `tool_result` with `is_error: true` is rendered as a tool message starting "Error: ".
- `top_k`, `thinking`, `metadata`, `service_tier` and unknown fields are accepted and not used;
  the response header `x-envhub-ignored` names them. `tool_choice` `any` / `tool` force a call
  by constrained decoding (gateway/structured.py; `disable_parallel_tool_use` allows one call
  only); `none` drops the tools like the OpenAI route does.
- A final assistant message (prefill) is refused: the chat template closes every assistant
  turn, so it cannot be continued token-exactly.

Errors on these routes use Anthropic's shape: {"type": "error", "error": {"type", "message"}}.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from envhub.gateway.backends.base import SamplingParams
from envhub.gateway.errors import BadRequest, GatewayError, Overloaded
from envhub.gateway.openai_api import (
    ClientGone,
    check_model,
    flag,
    number,
    read_json,
    until_disconnect,
)
from envhub.gateway.render.messages import (
    normalize_message,
)
from envhub.gateway.service import ChatAnswer, ChatCall, Choice
from envhub.gateway.structured import Constraint, for_request

log = logging.getLogger("envhub.gateway.anthropic")
router = APIRouter()

_KNOWN = {"model", "messages", "system", "max_tokens", "tools", "tool_choice", "stop_sequences",
          "temperature", "top_p", "stream"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                409: "invalid_request_error",
                413: "request_too_large", 429: "rate_limit_error"}
_MAX_TOKENS = 1 << 20
_JOIN = "\n\n"  # between text blocks of one message (a single block stays byte-exact)


@dataclass
class MessagesRequest:
    """A validated /v1/messages body; `messages` are OpenAI-shaped (see to_messages)."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: SamplingParams
    stream: bool = False
    ignored: list[str] = field(default_factory=list)


# -- errors ----------------------------------------------------------------------------------

def error_response(exc: GatewayError, request: Request | None = None) -> Response:
    """A GatewayError in Anthropic's error shape (the app-wide handler renders OpenAI's)."""
    status = exc.status_code
    kind = _ERROR_TYPES.get(status, "api_error" if status < 529 else "overloaded_error")
    headers = {}
    if isinstance(exc, Overloaded):
        headers["retry-after"] = str(max(1, round(exc.retry_after)))
    if request is not None:
        request.app.state.gw.metrics.requests.labels(request.url.path, str(status)).inc()
    body = {"type": "error", "error": {"type": kind, "message": exc.message}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers=headers)


def _internal(exc: Exception) -> GatewayError:
    err = GatewayError(f"internal error: {type(exc).__name__}: {exc}")
    err.status_code = 500
    return err


# -- request conversion ----------------------------------------------------------------------

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
    """Anthropic tools ({name, description, input_schema}) → OpenAI function tools."""
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
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw: Any, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
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


def _constraint(renderer: Any, choice: Any, tools: list[dict[str, Any]] | None
                ) -> Constraint | None:
    """`any` / `tool` force a tool call; `disable_parallel_tool_use` allows at most one."""
    if not isinstance(choice, dict) or not tools:
        return None
    single = choice.get("disable_parallel_tool_use", False)
    if not isinstance(single, bool):
        raise BadRequest("'tool_choice.disable_parallel_tool_use' must be a JSON boolean",
                         param="tool_choice.disable_parallel_tool_use")
    force = {"any": "required", "tool": "named"}.get(choice["type"])
    # what a hosted model (litellm, OpenAI-shaped) takes for the same request
    request: dict[str, Any] = {"parallel_tool_calls": not single}
    if force == "required":
        request["tool_choice"] = "required"
    elif force == "named":
        request["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    return for_request(renderer, tools, force=force, name=choice.get("name"),
                       parallel=not single, request=request)


def _params(body: dict, stop_token_ids: list[int]) -> SamplingParams:
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise BadRequest("'max_tokens' is required: an integer >= 1 (the completion budget)",
                         param="max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) \
            or not 1 <= max_tokens <= _MAX_TOKENS:
        raise BadRequest(f"'max_tokens' must be an integer ≥ 1 and ≤ {_MAX_TOKENS}; got "
                         f"{max_tokens!r}", param="max_tokens")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or len(stops) > 16 or not all(
            isinstance(s, str) and s for s in stops):
        raise BadRequest("'stop_sequences' must be a list of up to 16 non-empty strings",
                         param="stop_sequences")
    # Anthropic caps temperature at 1; the engines take up to 2 (as on the OpenAI route)
    temperature = number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = number(body, "top_p", 1.0, 1e-9, 1.0)
    number(body, "top_k", None, 0, 1 << 20)
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise BadRequest("'metadata' must be an object", param="metadata")
    return SamplingParams(max_tokens=max_tokens, stop=list(stops), stop_token_ids=stop_token_ids,
                          temperature=temperature, top_p=top_p)


def parse_request(request: Request, body: dict[str, Any], *, counting: bool = False
                  ) -> MessagesRequest:
    """Validate and convert a /v1/messages (or count_tokens) body. Raises BadRequest/NotFound."""
    gw = request.app.state.gw
    model = check_model(request, body)
    messages = to_messages(body.get("system"), body.get("messages"))
    tools = _tool_choice(body.get("tool_choice"), to_tools(body.get("tools")))
    if counting:
        params = SamplingParams()
    else:
        params = _params(body, gw.renderer.stop_token_ids)
        params.constraint = _constraint(gw.renderer, body.get("tool_choice"), tools)
    stream = flag(body, "stream")
    ignored = sorted(k for k in body if k not in _KNOWN and body[k] is not None)
    return MessagesRequest(model, messages, tools, params, stream, ignored)


# -- response --------------------------------------------------------------------------------

def stop_sequence(choice: Choice, stops: list[str], renderer: Any) -> str | None:
    """The stop sequence that ended this completion, or None (EOS, length, tool call)."""
    res = choice.result
    if not stops or choice.tool_calls or res.finish_reason != "stop":
        return None
    reported = getattr(res, "stop_reason", None)  # the embedded engine names the match
    if isinstance(reported, str):
        return reported if reported in stops else None
    ids = res.completion_ids
    if not ids or ids[-1] in renderer.stop_token_ids:
        return None  # ended on an EOS id: end_turn
    window = 4 * max(len(s) for s in stops) + 4  # tokens enough to span any stop string
    tail = renderer.decode(ids[-window:])
    ends = {s: tail.rfind(s) + len(s) for s in stops if s in tail}
    return max(ends, key=lambda s: ends[s]) if ends else None


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def content_blocks(choice: Choice) -> list[dict[str, Any]]:
    """Text (if any) then one tool_use per call: echoed back, these hash as we recorded."""
    blocks: list[dict[str, Any]] = []
    if choice.parsed.content:
        blocks.append({"type": "text", "text": choice.parsed.content})
    for call in choice.tool_calls:
        blocks.append({"type": "tool_use", "id": _tool_id(call["id"]),
                       "name": call["function"]["name"],
                       "input": orjson.loads(call["function"]["arguments"])})
    return blocks


def _stop(choice: Choice, stops: list[str], renderer: Any) -> tuple[str, str | None]:
    if choice.tool_calls:
        return "tool_use", None
    if choice.finish_reason == "length":
        return "max_tokens", None
    matched = stop_sequence(choice, stops, renderer)
    return ("stop_sequence", matched) if matched else ("end_turn", None)


def message_body(answer: ChatAnswer, req: MessagesRequest, renderer: Any) -> dict[str, Any]:
    choice = answer.choices[0]
    reason, matched = _stop(choice, req.params.stop, renderer)
    return {"id": "msg_" + answer.id.removeprefix("chatcmpl-"), "type": "message",
            "role": "assistant", "model": req.model, "content": content_blocks(choice),
            "stop_reason": reason, "stop_sequence": matched,
            "usage": {"input_tokens": answer.prompt_tokens,
                      "output_tokens": len(choice.result.completion_ids),
                      "cache_creation_input_tokens": None, "cache_read_input_tokens": None},
            "envhub": {"seq": choice.seq, "weight_version": choice.result.weight_version}}


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def sse_events(message: dict[str, Any]) -> AsyncIterator[bytes]:
    """The finished message as Anthropic's event sequence (synthesised: the turn is already
    committed; each block is sent whole, as one delta)."""
    shell = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**message["usage"], "output_tokens": 0}}
    yield _event("message_start", {"type": "message_start", "message": shell})
    yield _event("ping", {"type": "ping"})
    for i, block in enumerate(message["content"]):
        start: dict[str, Any]
        delta: dict[str, Any]
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta",
                     "partial_json": orjson.dumps(block["input"]).decode()}
        yield _event("content_block_start", {"type": "content_block_start", "index": i,
                                             "content_block": start})
        yield _event("content_block_delta", {"type": "content_block_delta", "index": i,
                                             "delta": delta})
        yield _event("content_block_stop", {"type": "content_block_stop", "index": i})
    yield _event("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
        "usage": message["usage"]})  # complete, as the response's: clients read it here
    yield _event("message_stop", {"type": "message_stop"})


# -- routes ----------------------------------------------------------------------------------

def _headers(message_id: str, req: MessagesRequest) -> dict[str, str]:
    headers = {"request-id": message_id}
    if req.ignored:
        headers["x-envhub-ignored"] = ",".join(req.ignored)
    return headers


@router.post("/v1/messages")
async def messages(request: Request) -> Response:
    gw = request.app.state.gw
    try:
        body = await read_json(request)
        req = parse_request(request, body)
        live = await gw.sessions.authenticate(request.state.api_key)
        gw.metrics.in_flight.inc()
        try:
            # normalised lazily by the service: messages seen earlier in the session are
            # neither re-validated nor re-hashed (cost ∝ new messages, as on the OpenAI route)
            answer = await until_disconnect(request, gw.service.chat(
                live, gw.sessions.history, ChatCall(req.messages, req.tools, req.params,
                                                    normalize=normalize_message,
                                                    requested_model=req.model)))
        finally:
            gw.metrics.in_flight.dec()
    except GatewayError as exc:
        return error_response(exc, request)
    except ClientGone:
        return Response(status_code=499)  # the client hung up; nobody reads this
    except Exception as exc:  # keep the Anthropic shape; the cause goes to the log
        log.exception("unexpected error on /v1/messages")
        return error_response(_internal(exc), request)
    message = message_body(answer, req, gw.renderer)
    headers = _headers(message["id"], req)
    if req.stream:
        return StreamingResponse(sse_events(message), media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache"})
    return Response(orjson.dumps(message), media_type="application/json", headers=headers)


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    """`input_tokens` = the prompt a /v1/messages call with this body would send now: planned
    against the session's history like a real turn (extend → held ids + appended messages),
    rendered, never recorded."""
    gw = request.app.state.gw
    try:
        req = parse_request(request, await read_json(request), counting=True)
        live = await gw.sessions.authenticate(request.state.api_key)
        n = await _prompt_length(gw, live, req.messages, req.tools)
    except GatewayError as exc:
        return error_response(exc, request)
    except Exception as exc:
        log.exception("unexpected error on /v1/messages/count_tokens")
        return error_response(_internal(exc), request)
    return Response(orjson.dumps({"input_tokens": n}), media_type="application/json")


async def _prompt_length(gw: Any, live: Any, raw: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None) -> int:
    return await gw.service.preview(live, gw.sessions.history, ChatCall(
        raw, tools, SamplingParams(), 1, normalize_message))
