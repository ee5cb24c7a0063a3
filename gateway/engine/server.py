"""`envhub engine`: an HTTP server speaking vLLM's token API in front of an Engine/ZeroEngine.

Routes: `POST /v1/completions` (prompt = token ids or lists of them; `return_token_ids` puts
`token_ids` and `prompt_token_ids` on each choice, as vLLM does), `GET /v1/models`,
`GET /health`, `POST /update_weights_from_disk` and `GET /get_weight_version` /
`GET /model_info` (SGLang's names and shapes), `GET /stats` (batching counters and
`requests_held`, the completions waiting at a /pause, also as Prometheus text on `GET /metrics`)
and
`GET /debug/requests?limit=N` (the prompt ids received, newest last), and vLLM's RL routes
(`/pause`, `/resume`, `/collective_rpc` reload_weights, `/update_weight_version`,
`/weight_info`: gateway/engine/rl_routes.py). Every completion carries
the top-level extra field `weight_version`, and each choice `forwards` (the forward passes
that produced it: fewer than its tokens when speculative decoding accepted drafts). Requests
may name their RL group (`group_id`, envhub's field). Errors use OpenAI's shape; bad input is
a 4xx.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from typing import Any, Protocol

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from envhub.gateway.backends.base import GenerateRequest
from envhub.gateway.engine.admission import check_request
from envhub.gateway.engine.api import CompletionRequest, UpdateWeightsRequest, error_body
from envhub.gateway.engine.result import EngineResult
from envhub.gateway.engine.rl_routes import PauseGate
from envhub.gateway.engine.rl_routes import router as rl_router
from envhub.gateway.errors import BadRequest, GatewayError, internal_error


class ServedEngine(Protocol):
    name: str
    model_path: str
    vocab_size: int
    max_model_len: int
    tokenizer: Any

    @property
    def weight_version(self) -> int: ...

    async def generate(self, request: GenerateRequest, *, ignore_eos: bool = False
                       ) -> EngineResult: ...

    async def load_weights(self, path: str, version: int | None = None) -> int: ...

    async def set_weight_version(self, version: int) -> None: ...

    def stats(self) -> dict[str, Any]: ...


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


class ReceivedLog:
    """Bounded in-memory record of the prompt ids each request brought (for tests/debugging)."""

    def __init__(self, size: int):
        self.entries: deque[dict[str, Any]] = deque(maxlen=size)

    def add(self, request_id: str, index: int, prompt_ids: list[int], session_id: str | None
            ) -> None:
        self.entries.append({"request_id": request_id, "index": index, "session_id": session_id,
                             "prompt_token_ids": prompt_ids, "received_at": time.time()})

    def recent(self, limit: int, request_id: str | None) -> list[dict[str, Any]]:
        rows = [e for e in self.entries if request_id is None or e["request_id"] == request_id]
        return rows[-limit:] if limit > 0 else []


def create_app(engine: ServedEngine, *, log_size: int = 1000,
               health_version: bool = True) -> FastAPI:
    app = FastAPI(title="envhub engine", docs_url=None, redoc_url=None)
    received = ReceivedLog(log_size)
    app.state.engine, app.state.received = engine, received
    app.state.pause_gate = gate = PauseGate()
    app.include_router(rl_router)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            at = next(e["loc"][-1] for e in errors if e.get("type") == "json_invalid")
            return _json(error_body(f"malformed JSON body (near character {at}): send a JSON "
                                    "object", code=400), 400)
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e['msg']}"
            for e in errors[:4])
        param = next((str(e["loc"][1]) for e in errors if len(e.get("loc", ())) > 1), None)
        return _json(error_body(f"invalid request: {problems}", param=param, code=400), 400)

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> Response:
        return _json(error_body(exc.message, exc.type, exc.param, exc.status_code),
                     exc.status_code)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Response:
        err = internal_error(exc, request.url.path)  # the cause goes to the log, not the body
        return _json(error_body(err.message, err.type, code=500), 500)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if body.stream:
            raise BadRequest("stream=true is not supported by envhub engine; send "
                             "stream=false (the gateway synthesizes streams)", param="stream")
        request_id = body.request_id or request.headers.get("x-request-id") or uuid.uuid4().hex
        prompts = [_prompt_ids(engine, p, body.add_special_tokens) for p in body.prompts()]
        jobs = []
        for i, ids in enumerate(prompts):
            for k in range(body.n):
                seed = None if body.seed is None else body.seed + k  # sample k of n: seed + k
                jobs.append(GenerateRequest(ids, body.sampling(seed), f"{request_id}-{i}-{k}",
                                            body.session_id or "", group_id=body.group_id or ""))
        for job in jobs:  # all or nothing: reject before any work starts
            check_request(job, engine.vocab_size, engine.max_model_len)
        async with gate.admit():  # held here while paused (vLLM's /pause)
            for i, ids in enumerate(prompts):
                received.add(request_id, i, ids, body.session_id)
            results = await asyncio.gather(
                *(engine.generate(job, ignore_eos=body.ignore_eos) for job in jobs))
        return _json(_completion_body(engine, body, request_id, jobs, results))

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [{
            "id": engine.name, "object": "model", "created": int(time.time()),
            "owned_by": "envhub", "root": engine.model_path,
            "max_model_len": engine.max_model_len}]})

    @app.get("/health")
    async def health() -> Response:
        if not health_version:  # vLLM's shape: clients must ask /weight_info
            return Response(status_code=200)
        return _json({"status": "ok", "model": engine.name,
                      "weight_version": engine.weight_version})

    @app.get("/get_weight_version")
    async def get_weight_version() -> Response:
        return _json({"weight_version": engine.weight_version})

    @app.get("/model_info")
    async def model_info() -> Response:
        return _json({"model_path": engine.model_path, "weight_version": engine.weight_version,
                      "is_generation": True})

    @app.post("/update_weights_from_disk")
    async def update_weights(body: UpdateWeightsRequest) -> Response:
        try:
            version = body.version()
        except ValueError as exc:
            raise BadRequest(str(exc), param="weight_version") from exc
        try:
            new = await engine.load_weights(body.model_path, version)
        except GatewayError as exc:  # SGLang's shape (success/message) plus OpenAI's error
            return _json({"success": False, "message": exc.message,
                          **error_body(exc.message, exc.type, exc.param, exc.status_code)},
                         exc.status_code)
        return _json({"success": True, "message": f"loaded {body.model_path}",
                      "weight_version": new, "num_paused_requests": 0})

    def counters() -> dict[str, Any]:
        return {**engine.stats(), "requests_held": gate.held}

    @app.get("/stats")
    async def stats() -> Response:
        return _json(counters())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(prometheus_text(counters()), media_type="text/plain; version=0.0.4")

    @app.get("/debug/requests")
    async def debug_requests(limit: int = 50, request_id: str | None = None) -> Response:
        return _json({"requests": received.recent(limit, request_id)})

    return app


def prometheus_text(stats: dict[str, Any]) -> bytes:
    """The engine's numeric counters as Prometheus text (`envhub_engine_<name>`); tokens per
    forward = generated_tokens / forwards, draft acceptance = accepted / drafted tokens."""
    lines = [f"envhub_engine_{k} {float(v)}" for k, v in stats.items()
             if isinstance(v, int | float) and not isinstance(v, bool)]
    return ("\n".join(lines) + "\n").encode()


def _prompt_ids(engine: ServedEngine, prompt: list[int] | str, add_special: bool) -> list[int]:
    if isinstance(prompt, list):
        return prompt
    if engine.tokenizer is None:
        raise BadRequest("this engine has no tokenizer: send the prompt as token ids",
                         param="prompt")
    return list(engine.tokenizer.encode(prompt, add_special_tokens=add_special))


def _completion_body(engine: ServedEngine, body: CompletionRequest, request_id: str,
                     jobs: list[GenerateRequest], results: list[EngineResult]) -> dict[str, Any]:
    tok = engine.tokenizer
    choices = []
    for index, (job, r) in enumerate(zip(jobs, results, strict=True)):
        text = tok.decode(r.completion_ids, skip_special_tokens=body.skip_special_tokens) \
            if tok is not None else ""
        if isinstance(r.stop_reason, str) and not body.include_stop_str_in_output:
            cut = text.find(r.stop_reason)
            text = text[:cut] if cut >= 0 else text
        if body.echo and tok is not None:
            text = tok.decode(job.prompt_ids, skip_special_tokens=body.skip_special_tokens) + text
        choice: dict[str, Any] = {
            "index": index, "text": text, "finish_reason": r.finish_reason,
            "stop_reason": r.stop_reason, "forwards": r.forwards,
            "logprobs": _logprobs(tok, r, bool(body.return_tokens_as_token_ids))
            if body.logprobs is not None else None}
        if body.return_token_ids:
            choice["token_ids"] = r.completion_ids
            choice["prompt_token_ids"] = job.prompt_ids
        choices.append(choice)
    prompt_tokens = sum(len(j.prompt_ids) for j in jobs[::body.n])  # each prompt once
    completion_tokens = sum(len(r.completion_ids) for r in results)
    return {"id": f"cmpl-{request_id}", "object": "text_completion", "created": int(time.time()),
            "model": engine.name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            "weight_version": min((r.weight_version for r in results),
                                  default=engine.weight_version)}


def _logprobs(tok: Any, r: EngineResult, as_ids: bool) -> dict[str, Any]:
    """The completions-API logprobs object; top_logprobs always include the sampled token."""
    def label(t: int) -> str:
        return f"token_id:{t}" if as_ids or tok is None else tok.decode([t])

    tokens = [label(t) for t in r.completion_ids]
    offsets, at = [], 0
    for s in tokens:
        offsets.append(at)
        at += len(s)
    rows = r.top_logprobs or [[] for _ in r.completion_ids]
    top = [{**{label(t): lp for t, lp in row}, label(tid): lp_s}
           for row, tid, lp_s in zip(rows, r.completion_ids, r.logprobs, strict=True)]
    return {"tokens": tokens, "token_logprobs": r.logprobs, "top_logprobs": top,
            "text_offset": offsets}
