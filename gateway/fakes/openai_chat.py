"""A fake hosted model: OpenAI's `POST /v1/chat/completions` and `GET /v1/models` shapes.

It answers `echo: <last user text>` (cut to `max_tokens` words, finish `length`), or, when the
request offers tools and the last user text starts with `tool:`, one call of the first tool
with `{"expr": <rest of the text>}` (finish `tool_calls`). Records every request body.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from envhub.gateway.fakes.faults import Faults


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(message: str, status: int, type_: str = "invalid_request_error") -> Response:
    return _json({"error": {"message": message, "type": type_, "param": None, "code": None}},
                 status)


class FakeChat:
    def __init__(self, model: str = "gpt-fake"):
        self.model = model
        self.faults = Faults()
        self.received: list[dict[str, Any]] = []

    def answer(self, body: dict[str, Any]) -> Response:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error("'messages' must be a non-empty array", 400)
        self.received.append(body)
        status = self.faults.take()
        if status is not None:
            kind = "rate_limit_error" if status == 429 else "server_error"
            return _error(f"injected failure {status}", status, kind)
        last = next((m.get("content") for m in reversed(messages)
                     if isinstance(m, dict) and m.get("role") == "user"), "") or ""
        text = last if isinstance(last, str) else str(last)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        tools = body.get("tools") or []
        if tools and text.startswith("tool:"):
            name = tools[0]["function"]["name"]
            message["tool_calls"] = [{
                "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(
                    {"expr": text[5:].strip()}).decode()}}]
            finish = "tool_calls"
        else:
            words = f"echo: {text}".split(" ")
            limit = body.get("max_tokens") or body.get("max_completion_tokens")
            finish = "stop"
            if isinstance(limit, int) and len(words) > limit:
                words, finish = words[:limit], "length"
            message["content"] = " ".join(words)
        n_out = len((message["content"] or "").split())
        return _json({
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model") or self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}],
            "usage": {"prompt_tokens": sum(len(str(m.get("content", "")).split())
                                           for m in messages if isinstance(m, dict)),
                      "completion_tokens": n_out, "total_tokens": n_out}})


def openai_chat_app(fake: FakeChat | None = None) -> FastAPI:
    """ASGI app of the fake (`app.state.fake`); serve it under any base URL ending in /v1."""
    fake = fake or FakeChat()
    app = FastAPI(title="fake openai", docs_url=None, redoc_url=None)
    app.state.fake = fake

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _error("malformed JSON body", 400)
        if not isinstance(body, dict):
            return _error("send a JSON object", 400)
        return fake.answer(body)

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [{"id": fake.model, "object": "model",
                                                  "created": 0, "owned_by": "fake"}]})

    @app.post("/fake/fail")
    async def fail(request: Request) -> Response:
        body = orjson.loads(await request.body() or b"{}")
        fake.faults.count, fake.faults.status = int(body.get("count", 1)), \
            int(body.get("status", 500))
        return _json({"armed": fake.faults.count})

    @app.get("/fake/requests")
    async def requests() -> Response:
        return _json({"requests": fake.received})

    return app
