"""OpenAI-compatible routes: /v1/chat/completions (+SSE), /v1/completions, /v1/models.

Upstream calls are never streamed: the engine answers whole, the turn is committed, then a
stream is synthesised for clients that asked for one (token-exact ids stay ours; see vLLM
PR #29074 for why streaming through a tool parser is risky).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from envhub.gateway.backends.base import SamplingParams
from envhub.gateway.errors import BadRequest, NotFound
from envhub.gateway.models.base import OPENAI_ERRORS, STREAMS, Body, body_of, ignored_header, parse
from envhub.gateway.models.openai import ChatRequest, CompletionRequest, Sampling
from envhub.gateway.render.messages import normalize_message
from envhub.gateway.service import ChatAnswer, ChatCall, new_chain
from envhub.gateway.strict import strict_names
from envhub.gateway.structured import Constraint, for_request, forced_call

router = APIRouter(responses=OPENAI_ERRORS)


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json",
                    headers=headers)


async def read_json(request: Request) -> dict[str, Any]:
    try:
        raw = await request.body()
    except ClientDisconnect:  # gone before its body was whole: nobody to answer
        raise ClientGone() from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON ({e}); send a JSON object") \
            from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


async def until_disconnect(request: Request, work: Any) -> Any:
    """Await `work`; cancel it if the client hangs up first (the engine call is aborted, e.g.
    SGLang's /abort_request, and nothing is recorded for an answer nobody will read). The work
    runs in the request's own task: a watcher cancels that task on a disconnect."""
    me = asyncio.current_task()
    assert me is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        # the body is read, so the next receive() returns only when the client disconnects
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        me.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise  # the server itself is cancelling us
        me.uncancel()
        raise ClientGone() from None
    finally:
        watcher.cancel()


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def _tool_choice(raw: Any, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tools to render for `tool_choice` (its shape is checked by the request model). A
    named function must be declared; 'required' needs tools. Forcing the call is the
    constraint's job (openai_constraint). 'none' renders no tools, and a call the model makes
    anyway comes back as text (ChatService._choice: undeclared_tool)."""
    if raw is None or raw == "auto":
        return tools
    if raw == "none":
        return None
    if raw == "required":
        if not tools:
            raise BadRequest("tool_choice 'required' needs a non-empty 'tools' list",
                             param="tool_choice")
        return tools
    name = raw["function"]["name"]
    declared = [t["function"]["name"] for t in tools or []]
    if name not in declared:
        raise BadRequest(f"tool_choice names the function {name!r}, which is not in "
                         f"'tools' (declared: {', '.join(declared) or 'none'})",
                         param="tool_choice")
    return tools


def openai_constraint(renderer: Any, body: dict, tools: list[dict[str, Any]] | None
                      ) -> Constraint | None:
    """response_format, tool_choice 'required' / named and parallel_tool_calls false, as a
    sampling constraint (gateway/structured.py); tools are already checked by _tool_choice."""
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    parallel = True if parallel is None else parallel
    force, name = forced_call(choice)
    request = {k: body[k] for k in ("response_format", "tool_choice", "parallel_tool_calls")
               if k in body}
    return for_request(renderer, tools, fmt=body.get("response_format"), force=force,
                       name=name, parallel=parallel, request=request)


def sampling_params(req: Sampling, default_max_tokens: int, stop_token_ids: list[int],
                    top_logprobs: int = 0, max_tokens: int | None = None) -> SamplingParams:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return SamplingParams(
        max_tokens=max_tokens or req.max_tokens or default_max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        stop=stop, stop_token_ids=stop_token_ids, seed=req.seed, top_logprobs=top_logprobs)


def ignored_headers(req: Body) -> dict[str, str]:
    """`x-envhub-ignored`: the fields the client set that change nothing here."""
    names = ignored_header(req.ignored())
    return {"x-envhub-ignored": names} if names else {}


def check_model(request: Request, model: str) -> str:
    """The requested model name (echoed in the response and recorded on the turn), once the
    alias table maps it to a served model; NotFound when nothing serves it."""
    models = request.app.state.gw.models
    if models.resolve(model) is None:
        raise NotFound(f"the model '{model}' does not exist here; {models.describe()} (add "
                       "one with --model-alias PATTERN=MODEL)", param="model",
                       code="model_not_found")
    return model


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    gw = request.app.state.gw
    return json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "envhub"}
        for name in sorted(gw.model_names)]})


@router.post("/v1/chat/completions", openapi_extra=body_of(ChatRequest), responses=STREAMS)
async def chat_completions(request: Request) -> Response:
    t0 = time.perf_counter()
    gw = request.app.state.gw
    # the model checks the fields; the raw body's tools and messages go on unchanged
    body = await read_json(request)
    req = parse(ChatRequest, body)
    model = check_model(request, req.model)
    messages = body["messages"]
    tools = _tool_choice(body.get("tool_choice"), body.get("tools"))
    params = sampling_params(req, gw.config.default_max_tokens, gw.renderer.stop_token_ids,
                             top_logprobs=req.top_logprobs or 0,
                             max_tokens=req.max_completion_tokens)
    n = req.n or 1
    params.constraint = openai_constraint(gw.renderer, body, tools)
    stream = bool(req.stream)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    live = await gw.sessions.authenticate(request.state.api_key)
    gw.metrics.in_flight.inc()
    try:
        answer = await until_disconnect(request, gw.service.chat(
            live, gw.sessions.history, ChatCall(
                messages, tools, params, n, normalize_message, requested_model=model,
                new_chain=new_chain(request.headers),
                tool_choice_none=body.get("tool_choice") == "none",
                strict=strict_names(tools))))
    finally:
        gw.metrics.in_flight.dec()
    want_lp = bool(req.logprobs)
    headers = ignored_headers(req)
    if stream:
        return StreamingResponse(_chat_stream(gw, answer, model, want_lp, include_usage),
                                 media_type="text/event-stream", headers=headers)
    out = _chat_body(gw, answer, model, want_lp, req.return_token_ids)
    # time the gateway itself spent (parse, render, record), without the engine's time
    out["envhub"]["gateway_ms"] = round((time.perf_counter() - t0) * 1000 - answer.backend_ms, 3)
    out["envhub"]["render_ms"] = round(answer.render_ms, 3)
    return json_response(out, headers=headers)


def _usage(answer: ChatAnswer) -> dict[str, int]:
    completion = sum(len(c.result.completion_ids) for c in answer.choices)
    return {"prompt_tokens": answer.prompt_tokens, "completion_tokens": completion,
            "total_tokens": answer.prompt_tokens + completion}


def _logprobs(gw: Any, choice: Any) -> dict[str, Any]:
    dec = gw.renderer.decode
    res = choice.result
    tops = res.top_logprobs or [[] for _ in res.completion_ids]
    content = []
    for tid, lp, alts in zip(res.completion_ids, res.logprobs, tops, strict=True):
        tok = dec([tid])
        content.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                        "top_logprobs": [{"token": dec([a]), "logprob": alp,
                                          "bytes": list(dec([a]).encode())}
                                         for a, alp in alts]})
    return {"content": content}


def _message(choice: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": choice.parsed.content}
    if choice.tool_calls:
        msg["tool_calls"] = choice.tool_calls
    elif msg["content"] is None:
        msg["content"] = ""
    return msg


def _chat_body(gw: Any, answer: ChatAnswer, model: str, want_lp: bool,
               token_ids: Any) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(answer.choices):
        item = {"index": i, "message": _message(c), "finish_reason": c.finish_reason,
                "logprobs": _logprobs(gw, c) if want_lp else None}
        if token_ids:
            item["token_ids"] = c.result.completion_ids
        choices.append(item)
    out = {"id": answer.id, "object": "chat.completion", "created": answer.created,
           "model": model, "choices": choices, "usage": _usage(answer),
           "envhub": {"seqs": [c.seq for c in answer.choices],
                      "weight_versions": [c.result.weight_version for c in answer.choices],
                      # engine forward passes per choice (None: the engine does not say);
                      # tokens / forwards > 1 when speculative decoding accepted drafts
                      "forwards": [c.result.forwards for c in answer.choices]}}
    return out


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _chat_stream(gw: Any, answer: ChatAnswer, model: str, want_lp: bool,
                       include_usage: bool) -> AsyncIterator[bytes]:
    base = {"id": answer.id, "object": "chat.completion.chunk", "created": answer.created,
            "model": model}
    for i, c in enumerate(answer.choices):
        yield _sse({**base, "choices": [{"index": i, "delta": {"role": "assistant",
                                                                "content": ""},
                                         "logprobs": None, "finish_reason": None}]})
        # Every sampled token's logprob goes out once, on the first chunk that carries output:
        # the text, else the first tool call (a tool-call answer has no text), else the final
        # chunk (a completion of only EOS). The stream is synthesised from a whole answer, so
        # tokens are not split between text and tool calls.
        pending = _logprobs(gw, c) if want_lp else None
        if c.parsed.content:
            yield _sse({**base, "choices": [{
                "index": i, "delta": {"content": c.parsed.content},
                "logprobs": pending, "finish_reason": None}]})
            pending = None
        for j, call in enumerate(c.tool_calls):
            yield _sse({**base, "choices": [{"index": i, "delta": {"tool_calls": [{
                "index": j, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"],
                             "arguments": call["function"]["arguments"]}}]},
                "logprobs": pending, "finish_reason": None}]})
            pending = None
        yield _sse({**base, "choices": [{"index": i, "delta": {}, "logprobs": pending,
                                         "finish_reason": c.finish_reason}]})
    if include_usage:
        yield _sse({**base, "choices": [], "usage": _usage(answer)})
    yield b"data: [DONE]\n\n"


@router.post("/v1/completions", openapi_extra=body_of(CompletionRequest))
async def completions(request: Request) -> Response:
    gw = request.app.state.gw
    req = parse(CompletionRequest, await read_json(request))
    model = check_model(request, req.model)
    if isinstance(req.prompt, str):
        ids = gw.renderer.encode(req.prompt)
    else:
        vocab = len(gw.renderer.tokenizer)
        if any(x >= vocab for x in req.prompt):
            raise BadRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
        ids = list(req.prompt)
    params = sampling_params(req, 16, [], top_logprobs=req.logprobs or 0)
    if req.stream:
        raise BadRequest("streaming is supported on /v1/chat/completions only", param="stream")
    live = await gw.sessions.authenticate(request.state.api_key)
    answer = await gw.service.complete(live, gw.sessions.history, ids, params, req.n or 1,
                                       requested_model=model)
    choices = []
    for i, c in enumerate(answer.choices):
        res = c.result
        lp = None
        if req.logprobs is not None:
            lp = {"tokens": [gw.renderer.decode([x]) for x in res.completion_ids],
                  "token_logprobs": res.logprobs,
                  "top_logprobs": [{gw.renderer.decode([a]): v for a, v in alts}
                                   for alts in (res.top_logprobs or [])] or None,
                  "text_offset": []}
        item = {"index": i, "text": gw.renderer.decode(res.completion_ids, skip_special=True),
                "logprobs": lp, "finish_reason": res.finish_reason}
        if req.return_token_ids:
            item["token_ids"] = res.completion_ids
            item["prompt_token_ids"] = ids
        choices.append(item)
    return json_response({"id": answer.id.replace("chatcmpl", "cmpl"), "object":
                          "text_completion", "created": answer.created, "model": model,
                          "choices": choices, "usage": _usage(answer)},
                         headers=ignored_headers(req))
