"""OpenAI Responses API: POST /v1/responses (+SSE), GET/DELETE /v1/responses/{id},
POST /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items.

A request is converted to chat messages (responses_items.py) and goes through the same
ChatService turn as /v1/chat/completions (plan → render → engine → parse → record): same
token-exact prompts, same CM-action detection, same recording. The engine answers whole, the
turn is committed, then the stream (if asked for) is synthesised from the finished response.

Decisions where the API and this gateway meet:
- `previous_response_id`: the conversation is the stored chain (responses_log.py) plus this
  request's input; `instructions` are not inherited (as documented by OpenAI). A response
  belongs to its session: another session's key gets 404, like an unknown id.
- `store: false` responses are neither retrievable nor usable as `previous_response_id`.
- `background: true` gets a 400 (every response is answered in the foreground).
- `text.format` json_object / json_schema, `tool_choice` required / named and
  `parallel_tool_calls: false` are honoured by constrained decoding, as on the chat route
  (gateway/structured.py); a backend that cannot constrain answers 400.
- `include: ["message.output_text.logprobs"]` returns the rollout logprobs on `output_text`.
- Cancel answers as the API does for a response that was not created in the background: 400.
- `namespace` tools (Codex groups each MCP server's tools so): each function is offered to the
  model as `NAMESPACE__NAME` (`mcp__envhub__submit`, Claude Code's naming), and its calls come
  back as `function_call` items with `namespace` and the tool's own `name`, as Codex expects;
  echoed back, they render as the model wrote them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from envhub.gateway.backends.base import SamplingParams
from envhub.gateway.errors import BadRequest, NotFound
from envhub.gateway.models.base import OPENAI_ERRORS, STREAMS, ignored_header
from envhub.gateway.models.responses import MessageItem, ResponsesRequest, qualified_name
from envhub.gateway.openai_api import (
    _logprobs,
    _tool_choice,
    check_model,
    json_response,
    until_disconnect,
)
from envhub.gateway.render.messages import normalize_message
from envhub.gateway.responses_items import (
    chat_tool_choice,
    flat_tools,
    namespaced,
    output_items,
    to_messages,
    to_tools,
    with_ids,
)
from envhub.gateway.responses_log import ITEMS, StoredResponse
from envhub.gateway.service import ChatAnswer, ChatCall, new_chain
from envhub.gateway.structured import Constraint, for_request, forced_call

router = APIRouter(responses=OPENAI_ERRORS)
LOGPROBS = "message.output_text.logprobs"


@router.post("/v1/responses", responses=STREAMS)
async def create_response(request: Request, body: ResponsesRequest) -> Response:
    gw = request.app.state.gw
    check_model(request, body.model)
    _refuse_unsupported(body)
    live = await gw.sessions.authenticate(request.state.api_key)
    earlier: list[Any] = []
    link: StoredResponse | None = None
    if body.previous_response_id is not None:
        link = await gw.responses.get(body.previous_response_id)
        if link is None or link.deleted or link.session_id != live.id:
            raise BadRequest(f"previous response {body.previous_response_id!r} not found (a "
                             "response created with store: false cannot be continued)",
                             param="previous_response_id", code="previous_response_not_found")
        earlier = ITEMS.validate_python(await gw.responses.conversation(link))
    new: list[Any] = [MessageItem(role="user", content=body.input)] \
        if isinstance(body.input, str) else list(body.input or [])
    if not earlier and not new:
        raise BadRequest("'input' is required: a string or a non-empty list of items",
                         param="input")
    messages = to_messages(body.instructions, earlier + new)
    if not messages:
        raise BadRequest("the input renders to no message (only empty reasoning items); send "
                         "a message or a function_call_output", param="input")
    tools = _tool_choice(chat_tool_choice(body.tool_choice), to_tools(body.tools))
    want_lp = LOGPROBS in (body.include or []) or bool(body.top_logprobs)
    params = SamplingParams(
        max_tokens=body.max_output_tokens or gw.config.default_max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop_token_ids=gw.renderer.stop_token_ids, top_logprobs=body.top_logprobs or 0,
        constraint=_constraint(gw, body, tools))
    gw.metrics.in_flight.inc()
    try:
        answer = await until_disconnect(request, gw.service.chat(
            live, gw.sessions.history, ChatCall(
                messages, tools, params, 1, normalize_message, requested_model=body.model,
                new_chain=new_chain(request.headers),
                tool_choice_none=body.tool_choice == "none",
                strict=_checked(body))))
    finally:
        gw.metrics.in_flight.dec()
    out = response_body(gw, answer, body, want_lp)
    if body.store is not False:
        own = new
        if link is None:  # a client that resends the conversation: store only what is new
            link, own = await gw.responses.implicit_base(live.id, new)
        await gw.responses.save(StoredResponse(out["id"], live.id, link.id if link else None,
                                               out, with_ids(own)), earlier + new)
    headers = {"x-request-id": out["id"]}
    ignored = ignored_header(body.ignored())
    if ignored:
        headers["x-envhub-ignored"] = ignored
    if body.stream:
        return StreamingResponse(sse_events(out), media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache"})
    return Response(orjson.dumps(out), media_type="application/json", headers=headers)


def _refuse_unsupported(body: ResponsesRequest) -> None:
    if body.background:
        raise BadRequest("background responses are not supported: send the request without "
                         "'background' (every response is answered in the foreground)",
                         param="background")


def _constraint(gw: Any, body: ResponsesRequest, tools: list[dict[str, Any]] | None
                ) -> Constraint | None:
    """text.format, tool_choice and parallel_tool_calls as a sampling constraint."""
    fmt = body.text.format if body.text is not None else None
    chat_format = fmt.chat_form() if fmt is not None else None
    choice = body.tool_choice
    force, name = forced_call(chat_tool_choice(choice))
    request: dict[str, Any] = {}
    if chat_format is not None:
        request["response_format"] = chat_format
    if choice is not None:
        request["tool_choice"] = chat_tool_choice(choice)
    if body.parallel_tool_calls is not None:
        request["parallel_tool_calls"] = body.parallel_tool_calls
    try:
        return for_request(gw.renderer, _strict(body, tools), fmt=chat_format, force=force,
                           name=name, parallel=body.parallel_tool_calls is not False,
                           request=request)
    except BadRequest as e:  # name the Responses field, not the chat one
        if e.param and e.param.startswith("response_format"):
            e.param = "text.format" + e.param[len("response_format"):].replace(
                ".json_schema", "", 1)
        raise


def _strict(body: ResponsesRequest, tools: list[dict[str, Any]] | None
            ) -> list[dict[str, Any]] | None:
    """The tools as the constraint sees them: `strict` is on unless a tool says false (the
    Responses API's default); the rendered tools are left as they were."""
    loose = {t.name if ns is None else qualified_name(ns, t.name)
             for ns, t in flat_tools(body.tools) if t.strict is False}
    return [t if t["function"]["name"] in loose else
            {**t, "function": {**t["function"], "strict": True}} for t in tools or []] or None


def _checked(body: ResponsesRequest) -> dict[str, bool]:
    """The functions whose sampled calls are checked (strict.StrictArguments): every one not
    saying `strict: false`; True where the tool says `strict: true` itself (its schema must then
    be one strict mode supports), False where strict is the API's default (checked when it can
    be)."""
    return {t.name if ns is None else qualified_name(ns, t.name): t.strict is True
            for ns, t in flat_tools(body.tools) if t.strict is not False}


def response_body(gw: Any, answer: ChatAnswer, body: ResponsesRequest, want_lp: bool
                  ) -> dict[str, Any]:
    choice = answer.choices[0]
    res = choice.result
    incomplete = choice.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    logprobs = _logprobs(gw, choice)["content"] if want_lp else None
    output = output_items(choice, status, logprobs, namespaced(body.tools))
    completion = len(res.completion_ids)
    return {
        "id": "resp_" + answer.id.removeprefix("chatcmpl-"), "object": "response",
        "created_at": answer.created, "completed_at": int(time.time()), "status": status,
        "background": False, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "model": body.model, "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": None, "summary": None}, "store": body.store is not False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)
                 if body.text is not None and body.text.format is not None
                 else {"type": "text"}},
        "tool_choice": body.tool_choice.model_dump() if body.tool_choice is not None
        and not isinstance(body.tool_choice, str) else body.tool_choice or "auto",
        "tools": [t.model_dump() for t in body.tools or []],
        "top_logprobs": body.top_logprobs or 0,
        "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": "disabled",
        "usage": {"input_tokens": answer.prompt_tokens,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": completion,
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": answer.prompt_tokens + completion},
        "user": body.user, "metadata": body.metadata or {},
        "envhub": {"seq": choice.seq, "weight_version": res.weight_version},
    }


# -- streaming ---------------------------------------------------------------------------------

def _sse(kind: str, seq: int, data: dict[str, Any]) -> bytes:
    return (b"event: " + kind.encode() + b"\ndata: "
            + orjson.dumps({"type": kind, "sequence_number": seq, **data}) + b"\n\n")


def _item_events(index: int, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The documented events of one finished output item, in order (each sent whole)."""
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        return [
            ("response.output_item.added", {"output_index": index, "item": {
                **item, "arguments": "", "status": "in_progress"}}),
            ("response.function_call_arguments.delta", {**at, "delta": item["arguments"]}),
            ("response.function_call_arguments.done", {**at, "name": item["name"],
                                                       "arguments": item["arguments"]}),
            ("response.output_item.done", {"output_index": index, "item": item}),
        ]
    part = item["content"][0]
    lps = [{k: v for k, v in lp.items() if k != "bytes"} for lp in part["logprobs"]]
    part_at = {**at, "content_index": 0}
    return [
        ("response.output_item.added", {"output_index": index, "item": {
            **item, "content": [], "status": "in_progress"}}),
        ("response.content_part.added", {**part_at, "part": {**part, "text": "",
                                                             "logprobs": []}}),
        ("response.output_text.delta", {**part_at, "delta": part["text"], "logprobs": lps}),
        ("response.output_text.done", {**part_at, "text": part["text"], "logprobs": lps}),
        ("response.content_part.done", {**part_at, "part": part}),
        ("response.output_item.done", {"output_index": index, "item": item}),
    ]


async def sse_events(response: dict[str, Any]) -> AsyncIterator[bytes]:
    shell = {**response, "status": "in_progress", "output": [], "usage": None,
             "incomplete_details": None, "completed_at": None}
    events = [("response.created", {"response": shell}),
              ("response.in_progress", {"response": shell})]
    for i, item in enumerate(response["output"]):
        events += _item_events(i, item)
    final = "response.incomplete" if response["status"] == "incomplete" \
        else "response.completed"
    events.append((final, {"response": response}))
    for seq, (kind, data) in enumerate(events):
        yield _sse(kind, seq, data)


# -- stored responses --------------------------------------------------------------------------

async def _stored(request: Request, response_id: str) -> StoredResponse:
    """The stored response, if the caller's key may read it (its session's key or the admin
    key); 404 otherwise, without telling the two apart."""
    gw = request.app.state.gw
    token = request.state.api_key
    stored = await gw.responses.get(response_id)
    if stored is not None and stored.deleted:
        stored = None
    if stored is not None and not gw.sessions.is_admin(token):
        live = await gw.sessions.by_key(token or "default")
        if live is None or live.id != stored.session_id:
            stored = None
    if stored is None:
        raise NotFound(f"no response {response_id!r} here (responses created with store: "
                       "false are not kept)", param="response_id")
    return stored


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    return json_response((await _stored(request, response_id)).body)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    stored = await _stored(request, response_id)
    await request.app.state.gw.responses.delete(stored)
    return json_response({"id": stored.id, "object": "response.deleted", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str) -> Response:
    await _stored(request, response_id)
    raise BadRequest("only responses created with background: true can be cancelled; this "
                     "one was answered in the foreground and is already complete",
                     param="response_id")


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(request: Request, response_id: str,
                      limit: int = Query(20, ge=1, le=100),
                      order: str = Query("desc", pattern="^(asc|desc)$"),
                      after: str | None = None) -> Response:
    """The input items of the request (those inherited through previous_response_id are
    not listed; a resent conversation stored as a link is listed whole)."""
    stored = await _stored(request, response_id)
    items = list(stored.input)
    if stored.previous_id is not None and stored.body["previous_response_id"] is None:
        base = await request.app.state.gw.responses.get(stored.previous_id)
        if base is not None:
            items = [*await request.app.state.gw.responses.conversation(base), *items]
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise BadRequest(f"'after' names no input item of this response: {after!r}",
                             param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return json_response({"object": "list", "data": page,
                          "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None,
                          "has_more": len(items) > limit})
