"""A fake SGLang server: SGLang's native HTTP API in front of the zero-work engine.

Routes and shapes follow SGLang's docs (native API, sampling parameters):
`POST /generate` (input_ids + sampling_params; `meta_info.output_token_logprobs` rows are
`[logprob, token_id, None]` with return_logprob, `finish_reason` is `{"type": "stop",
"matched": id}` / `{"type": "length", "length": n}` / `{"type": "abort", ...}`,
`meta_info.weight_version` is a string), `POST /abort_request {rid}`, `GET /health`,
`GET /model_info` and `/get_model_info`, `POST /update_weights_from_disk {model_path,
weight_version}` -> `{success, message, num_paused_requests}`, `POST /flush_cache`.
`token_delay` (seconds per sampled token) makes requests last long enough to abort.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from envhub.gateway.backends.base import GenerateRequest, SamplingParams
from envhub.gateway.engine.zero import ZeroEngine
from envhub.gateway.errors import GatewayError
from envhub.gateway.fakes.faults import Faults


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _bad(message: str, status: int = 400) -> Response:
    return _json({"error": {"message": message}}, status)


class FakeSGLang:
    def __init__(self, length: int = 8, token_delay: float = 0.0,
                 weight_version: str = "default", model_path: str = "fake/zero"):
        self.engine = ZeroEngine(length)
        self.token_delay = token_delay
        self.weight_version = weight_version
        self.model_path = model_path
        self.faults = Faults()
        self.health_delay = 0.0  # seconds /health takes to answer (an overloaded engine)
        self.received: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self._running: dict[str, asyncio.Event] = {}

    async def generate(self, body: dict[str, Any]) -> Response:
        rid = str(body.get("rid") or f"rid-{len(self.received)}")
        ids, sp = body.get("input_ids"), body.get("sampling_params") or {}
        if not isinstance(ids, list) or not ids or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in ids):
            return _bad("input_ids must be a non-empty list of token ids (this fake takes one "
                        "prompt per request)")
        if not isinstance(sp, dict):
            return _bad("sampling_params must be an object")
        self.received.append(body)
        status = self.faults.take()
        if status is not None:
            return _bad(f"injected failure {status}", status)
        t0 = time.perf_counter()
        try:
            params = SamplingParams(
                max_tokens=int(sp.get("max_new_tokens", 128)),
                temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
                stop_token_ids=[int(x) for x in sp.get("stop_token_ids") or []],
                top_logprobs=int(body.get("top_logprobs_num") or 0))
            result = await self.engine.generate(GenerateRequest(ids, params, rid))
        except GatewayError as exc:
            return _bad(exc.message)
        except (TypeError, ValueError) as exc:
            return _bad(f"invalid sampling_params: {exc}")
        finish: dict[str, Any] = {"type": "length", "length": len(result.completion_ids)} \
            if result.finish_reason == "length" else \
            {"type": "stop", "matched": result.completion_ids[-1]}
        if self.token_delay > 0:
            abort = self._running[rid] = asyncio.Event()
            try:
                await asyncio.wait_for(abort.wait(), self.token_delay * len(result.completion_ids))
                finish = {"type": "abort", "message": "Abort in waiting queue"}
            except TimeoutError:
                pass
            finally:
                self._running.pop(rid, None)
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": finish, "prompt_tokens": len(ids),
            "weight_version": self.weight_version,
            "completion_tokens": len(result.completion_ids), "cached_tokens": 0,
            "e2e_latency": time.perf_counter() - t0}
        if body.get("return_logprob"):
            pairs = zip(result.completion_ids, result.logprobs, strict=True)
            meta["output_token_logprobs"] = [[lp, t, None] for t, lp in pairs]
            if result.top_logprobs:
                meta["output_top_logprobs"] = [[[lp, t, None] for t, lp in row]
                                               for row in result.top_logprobs]
        return _json({"text": " ok" * len(result.completion_ids),
                      "output_ids": result.completion_ids, "meta_info": meta})

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)
        event = self._running.get(rid)
        if event is not None:
            event.set()

    def update_weights(self, body: dict[str, Any]) -> Response:
        path = body.get("model_path")
        if not isinstance(path, str) or not Path(path).exists():
            return _json({"success": False, "message": f"model_path {path!r} does not exist",
                          "num_paused_requests": 0}, 400)
        self.model_path = path
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return _json({"success": True, "message": "Succeeded to update model weights.",
                      "num_paused_requests": 0})

    def model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "tokenizer_path": self.model_path,
                "is_generation": True, "weight_version": self.weight_version}


def sglang_app(fake: FakeSGLang | None = None) -> FastAPI:
    """The ASGI app of a fake SGLang server (`app.state.fake` is the FakeSGLang)."""
    fake = fake or FakeSGLang()
    app = FastAPI(title="fake sglang", docs_url=None, redoc_url=None)
    app.state.fake = fake

    async def body_of(request: Request) -> dict[str, Any] | Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _bad("malformed JSON body")
        return body if isinstance(body, dict) else _bad("send a JSON object")

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await body_of(request)
        return body if isinstance(body, Response) else await fake.generate(body)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        fake.abort(str(body.get("rid", "")))
        return Response(status_code=200)

    @app.post("/update_weights_from_disk")
    async def update_weights(request: Request) -> Response:
        body = await body_of(request)
        return body if isinstance(body, Response) else fake.update_weights(body)

    @app.get("/health")
    async def health() -> Response:
        await asyncio.sleep(fake.health_delay)
        return Response(status_code=200)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> Response:
        return _json(fake.model_info())

    @app.post("/flush_cache")
    async def flush_cache() -> Response:
        return Response("Cache flushed.", status_code=200)

    @app.post("/fake/fail")
    async def fail(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        fake.faults.count, fake.faults.status = int(body.get("count", 1)), \
            int(body.get("status", 500))
        return _json({"armed": fake.faults.count})

    @app.post("/fake/slow_health")
    async def slow_health(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        fake.health_delay = float(body.get("delay", 0.0))
        return _json({"health_delay": fake.health_delay})

    @app.get("/fake/requests")
    async def requests() -> Response:
        return _json({"requests": fake.received, "aborted": fake.aborted})

    return app
