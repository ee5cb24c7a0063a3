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
  the response header `x-envhub-ignored` names them. The body is validated by the request model
  (models/anthropic.py), the content blocks by anthropic_convert.py. `tool_choice` `any` /
  `tool` force a call by constrained decoding (gateway/structured.py;
  `disable_parallel_tool_use` allows one call only); `none` drops the tools like the OpenAI
  route does; a call to a tool the request did not offer comes back as text (service.py).
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

from envhub.gateway.anthropic_convert import (
    constraint,
    json_output,
    to_messages,
    to_tools,
    tool_choice,
)
from envhub.gateway.backends.base import SamplingParams
from envhub.gateway.errors import (
    BodyTooLarge,
    GatewayError,
    Overloaded,
    PoolFault,
    internal_error,
)
from envhub.gateway.models.anthropic import CountTokensRequest, MessagesRequest
from envhub.gateway.models.base import ANTHROPIC_ERRORS, STREAMS, body_of, ignored_header, parse
from envhub.gateway.openai_api import ClientGone, check_model, read_json, until_disconnect
from envhub.gateway.render.messages import normalize_message
from envhub.gateway.service import ChatAnswer, ChatCall, Choice, new_chain
from envhub.gateway.strict import strict_names

log = logging.getLogger("envhub.gateway.anthropic")
router = APIRouter(responses=ANTHROPIC_ERRORS)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                409: "invalid_request_error",
                413: "request_too_large", 429: "rate_limit_error"}


@dataclass
class Call:
    """A validated /v1/messages body; `messages` are OpenAI-shaped (see to_messages)."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: SamplingParams
    stream: bool = False
    ignored: list[str] = field(default_factory=list)
    tool_choice_none: bool = False  # tools declared, none may be called


# -- errors ----------------------------------------------------------------------------------

def error_response(exc: GatewayError, request: Request | None = None) -> Response:
    """A GatewayError in Anthropic's error shape (the app-wide handler renders OpenAI's)."""
    status = exc.status_code
    kind = _ERROR_TYPES.get(status, "api_error" if status < 529 else "overloaded_error")
    headers = {}
    if isinstance(exc, Overloaded | PoolFault):
        headers["retry-after"] = str(max(1, round(exc.retry_after)))
    if isinstance(exc, PoolFault) and request is not None:
        request.app.state.gw.store.fault = exc.reason
    if request is not None:
        request.app.state.gw.metrics.requests.labels(request.url.path, str(status)).inc()
    body = {"type": "error", "error": {"type": kind, "message": exc.message}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers=headers)


def _internal(exc: Exception, where: str) -> GatewayError:
    return internal_error(exc, where, log)  # a generic message + an id; the cause is logged


def _params(req: MessagesRequest, stop_token_ids: list[int]) -> SamplingParams:
    return SamplingParams(
        max_tokens=req.max_tokens, stop=list(req.stop_sequences or []),
        stop_token_ids=stop_token_ids,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p)


def parse_request(request: Request, body: dict[str, Any], *, counting: bool = False
                  ) -> Call:
    """Validate and convert a /v1/messages (or count_tokens) body. Raises BadRequest/NotFound."""
    gw = request.app.state.gw
    req = parse(CountTokensRequest if counting else MessagesRequest, body)
    model = check_model(request, req.model)
    messages = to_messages(req.system, req.messages)
    choice = body.get("tool_choice")  # its shape checked by the model
    tools = tool_choice(choice, to_tools(req.tools))
    # built for count_tokens too: a request /v1/messages refuses is refused there as well
    made = constraint(gw.renderer, choice, tools, json_output(req.output_config,
                                                              req.output_format))
    if isinstance(req, MessagesRequest):
        params = _params(req, gw.renderer.stop_token_ids)
        params.constraint = made
        stream = bool(req.stream)
    else:
        params, stream = SamplingParams(), False
    none = isinstance(choice, dict) and choice.get("type") == "none"
    ignored = req.ignored() + [f"output_config.{k}" for k, v in (req.output_config or {}).items()
                               if k != "format" and v is not None]
    return Call(model, messages, tools, params, stream, sorted(ignored), none)


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


def message_body(answer: ChatAnswer, req: Call, renderer: Any) -> dict[str, Any]:
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

def _headers(message_id: str, req: Call) -> dict[str, str]:
    headers = {"request-id": message_id}
    ignored = ignored_header(req.ignored)
    if ignored:
        headers["x-envhub-ignored"] = ignored
    return headers


@router.post("/v1/messages", openapi_extra=body_of(MessagesRequest), responses=STREAMS)
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
                                                    requested_model=req.model,
                                                    new_chain=new_chain(request.headers),
                                                    tool_choice_none=req.tool_choice_none,
                                                    strict=strict_names(req.tools))))
        finally:
            gw.metrics.in_flight.dec()
    except GatewayError as exc:
        return error_response(exc, request)
    except ClientGone:  # the client hung up: the app's handler answers (and counts) the 499
        raise
    except BodyTooLarge:  # the edge answers 413
        raise
    except Exception as exc:  # keep the Anthropic shape; the cause goes to the log
        return error_response(_internal(exc, "/v1/messages"), request)
    message = message_body(answer, req, gw.renderer)
    headers = _headers(message["id"], req)
    if req.stream:
        return StreamingResponse(sse_events(message), media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache"})
    return Response(orjson.dumps(message), media_type="application/json", headers=headers)


@router.post("/v1/messages/count_tokens",
             openapi_extra=body_of(CountTokensRequest))
async def count_tokens(request: Request) -> Response:
    """`input_tokens` = the prompt a /v1/messages call with this body would send now: planned
    against the session's history like a real turn (extend → held ids + appended messages),
    rendered, never recorded."""
    gw = request.app.state.gw
    try:
        req = parse_request(request, await read_json(request), counting=True)
        live = await gw.sessions.authenticate(request.state.api_key)
        n = await gw.service.preview(live, gw.sessions.history, ChatCall(
            req.messages, req.tools, SamplingParams(), 1, normalize_message,
            new_chain=new_chain(request.headers), strict=strict_names(req.tools)))
    except GatewayError as exc:
        return error_response(exc, request)
    except BodyTooLarge:  # the edge answers 413
        raise
    except Exception as exc:
        return error_response(_internal(exc, "/v1/messages/count_tokens"), request)
    return Response(orjson.dumps({"input_tokens": n}), media_type="application/json")

