"""The gateway process: app factory, ASGI plumbing, in-thread and CLI serving."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from envhub.gateway import admin_api, admin_fleet, anthropic_api, openai_api, responses_api
from envhub.gateway.backends import backend_class, make_backend
from envhub.gateway.backends.base import Backend
from envhub.gateway.config import GatewayConfig
from envhub.gateway.errors import (
    BodyTooLarge,
    GatewayError,
    Overloaded,
    PoolFault,
    internal_error,
)
from envhub.gateway.metrics import Metrics
from envhub.gateway.model_names import ModelNames
from envhub.gateway.models.base import bad_request, install_openapi
from envhub.gateway.pool.store import Store
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.responses_log import ResponseLog
from envhub.gateway.service import ChatService
from envhub.gateway.sessions import Sessions
from envhub.sdk.serve import KEEP_ALIVE_S, ServerThread, bind, serve_in_thread

log = logging.getLogger("envhub.gateway")

__all__ = ["GatewayConfig", "GatewayHandle", "create_app", "run_in_thread", "serve"]


def _error_body(message: str, type_: str, param: str | None = None,
                code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}})


class _Edge:
    """ASGI middleware: session key from headers or `/s/{key}/...`, the body size limit, and
    an `x-envhub-gateway` header naming this process on every answer (behind a proxy that
    spreads sessions over several gateways, it says which one served a call). The `direct`
    routes ((method, path) → endpoint) are called here, with the app's exception handlers."""

    def __init__(self, app: Any, max_body: int, process: str,
                 direct: dict[tuple[str, str], Any] | None = None):
        self.app = app
        self.max_body = max_body
        self.process = (b"x-envhub-gateway", process.encode())
        self.direct = direct or {}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        # HTTP only: `_GatewayApp` hands lifespan events to FastAPI itself
        key = None
        path: str = scope["path"]
        if path.startswith("/s/"):
            _, _, rest = path.partition("/s/")
            key, _, tail = rest.partition("/")
            scope = dict(scope, path="/" + tail, raw_path=("/" + tail).encode())
        declared = None
        for name, value in scope["headers"]:
            if name == b"authorization" and key is None:
                v = value.decode("latin-1")
                key = v[7:].strip() if v[:7].lower() == "bearer " else v.strip()
            elif name == b"x-api-key" and key is None:
                key = value.decode("latin-1").strip()
            elif name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
        scope.setdefault("state", {})["api_key"] = key or None
        if declared is not None and declared > self.max_body:
            return await self._reject(send, declared)
        seen = 0
        started = False

        async def limited_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", ()), self.process]
            await send(message)

        endpoint = self.direct.get((scope["method"], scope["path"]))
        try:
            if endpoint is not None:
                await _call_direct(endpoint, scope, limited_receive, tracking_send)
            else:
                await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(send, seen)

    async def _reject(self, send: Any, size: int) -> None:
        body = _error_body(f"request body of {size} bytes exceeds the limit of {self.max_body}"
                           " bytes; send less or raise --max-body-bytes", "invalid_request_error",
                           code="request_too_large")
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


async def _call_direct(endpoint: Any, scope: dict, receive: Any, send: Any) -> None:
    """Serve a hot route (the model-call endpoints take only the request) without FastAPI's
    routing and dependency layers: the endpoint itself, then the app's exception handlers
    (by the exception's class, as Starlette looks them up)."""
    request = Request(scope, receive)
    try:
        response = await endpoint(request)
    except BodyTooLarge:
        raise
    except Exception as exc:
        handlers = scope["app"].exception_handlers
        handler = next((handlers[c] for c in type(exc).__mro__ if c in handlers), None)
        if handler is None:
            raise
        response = await handler(request, exc)
    await response(scope, receive, send)


# The model calls, served by _Edge straight from the endpoint: they take only the request, so
# FastAPI's routing, dependency solving and inner middleware add nothing but CPU on the
# gateway's hottest path (bench/bench_gateway_overhead.py). Their routes stay registered for
# OpenAPI and for the 405s of other methods.
_DIRECT = {("POST", "/v1/chat/completions"): openai_api.chat_completions,
           ("POST", "/v1/completions"): openai_api.completions,
           ("POST", "/v1/messages"): anthropic_api.messages}


class _GatewayApp(FastAPI):
    """FastAPI behind `_Edge`: every HTTP request passes the edge first, and the model calls
    (`_DIRECT`) go from there to their endpoint, past every layer of the framework (its error
    and telemetry middleware included: the endpoints and the app's exception handlers answer
    every error themselves)."""

    edge: _Edge

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        scope["app"] = self
        await self.edge(scope, receive, send)


_ROUTERS = (openai_api.router, responses_api.router, anthropic_api.router, admin_api.router,
            admin_fleet.router)


def _allowed(request: Request) -> str:
    """Every method some route serves on this path (Starlette's 405 names only the first
    route that matched the path: `GET /sessions` and `POST /sessions` are two routes)."""
    methods: set[str] = set()
    for route in (r for router in _ROUTERS for r in router.routes):
        match, _ = route.matches({**request.scope, "method": "\0"})
        if match == Match.PARTIAL:
            methods |= getattr(route, "methods", None) or set()
    methods.discard("HEAD")
    return ", ".join(sorted(methods))


@dataclass
class GatewayState:
    config: GatewayConfig
    renderer: ChatRenderer
    backend: Backend
    store: Store
    sessions: Sessions
    service: ChatService
    metrics: Metrics
    model_names: set[str]
    models: ModelNames
    responses: ResponseLog  # stored /v1/responses objects (previous_response_id, GET)
    url: str | None = None

    def public_url(self, request: Request) -> str:
        if self.url:
            return self.url
        return str(request.base_url).rstrip("/")


def create_app(config: GatewayConfig, backend: Backend | None = None) -> FastAPI:
    renderer = ChatRenderer.from_pretrained(config.tokenizer_path(), config.chat_template)
    if backend is None:
        backend = make_backend(config)
    store = Store(config.db)
    metrics = Metrics()
    process = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    sessions = Sessions(store, config.admin_key, holder=process)
    state = GatewayState(
        config=config, renderer=renderer, backend=backend, store=store, sessions=sessions,
        service=ChatService(renderer, backend, store, metrics, config.max_model_len,
                            text_backend=backend_class(config.backend).text_only),
        metrics=metrics, model_names={config.served_name(), "default"},
        models=config.model_table(), responses=ResponseLog(store))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await admin_fleet.start(state)  # fleet heartbeats + per-instance metrics
        yield
        await admin_fleet.stop(state)
        await backend.aclose()
        await asyncio.to_thread(store.close)

    app = _GatewayApp(title="envhub gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gw = state
    for router in _ROUTERS:
        app.include_router(router)

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        if isinstance(exc, PoolFault):  # /health reports it until a write gets through
            request.app.state.gw.store.fault = exc.reason
            live = request.app.state.gw.sessions.cached(getattr(request.state, "api_key", None))
            if live is not None:  # the runner asks after the agent: not the agent's failure
                live.pool_refused += 1
                live.pool_fault = exc.reason
        if request.url.path.startswith("/v1/messages"):
            return anthropic_api.error_response(exc, request)
        headers = {}
        if isinstance(exc, Overloaded | PoolFault):
            headers["retry-after"] = str(max(1, round(exc.retry_after)))
        if exc.error_id is not None:  # a 500, or an engine failure (cause in the log)
            headers["x-envhub-error-id"] = exc.error_id
        metrics.requests.labels(request.url.path, str(exc.status_code)).inc()
        return Response(_error_body(exc.message, exc.type, exc.param, exc.code),
                        status_code=exc.status_code, media_type="application/json",
                        headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        # bodies and query parameters declared as pydantic models: a 400 naming the field, in
        # the API's own error shape (FastAPI's default is a 422 in a shape no client reads)
        route = request.scope.get("route")
        model = getattr(getattr(route, "body_field", None), "type_", None)
        return await _gateway_error(request, bad_request(exc.errors(), model, located=True))

    @app.exception_handler(openai_api.ClientGone)
    @app.exception_handler(ClientDisconnect)  # a body FastAPI reads itself (Responses API)
    async def _client_gone(request: Request, exc: Exception) -> Response:
        metrics.requests.labels(request.url.path, "499").inc()
        return Response(status_code=499)  # nobody is listening; nginx's "client closed"

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # routing errors (404 no such path, 405 wrong method): keep Starlette's headers (a 405
        # carries `Allow`), in the shape of the API the path belongs to
        if isinstance(exc.__cause__, ClientDisconnect):  # FastAPI reading a body: its 400
            return await _client_gone(request, exc)
        err = GatewayError(str(exc.detail))
        err.status_code = exc.status_code
        if request.url.path.startswith("/v1/messages"):
            resp = anthropic_api.error_response(err)
        else:
            resp = Response(_error_body(err.message, "invalid_request_error"),
                            status_code=exc.status_code, media_type="application/json")
        resp.headers.update(exc.headers or {})
        if exc.status_code == 405:
            resp.headers["allow"] = _allowed(request)
        return resp

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # the body names no exception, type or path (they may leak internals); the error id
        # in it is logged with the traceback, so an operator can find the cause
        return await _gateway_error(request, internal_error(exc, request.url.path, log))

    app.edge = _Edge(functools.partial(FastAPI.__call__, app), max_body=config.max_body_bytes,
                     process=process, direct=_DIRECT)
    install_openapi(app)
    return app


@dataclass
class GatewayHandle:
    url: str
    admin_key: str | None
    app: FastAPI
    _running: ServerThread

    def close(self) -> None:
        self._running.close()

    def __enter__(self) -> GatewayHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_in_thread(config: GatewayConfig, backend: Backend | None = None) -> GatewayHandle:
    """Start a gateway on a background thread (port 0 → a free port); returns once serving."""
    app = create_app(config, backend)
    running = serve_in_thread(app, config.host, config.port, lifespan="on", graceful_timeout=5,
                              name="envhub-gateway", start_timeout=60)
    app.state.gw.url = (config.public_url or running.url).rstrip("/")  # read per request
    return GatewayHandle(running.url, config.admin_key, app, running)


# Objects allocated between two young-generation collections. A call allocates a few thousand
# short-lived containers (parsed JSON, messages, rows), so CPython's default (700) collects
# several times per call and walks every session's history in the older generations all the
# more often: about 13% of the process's CPU per call at 64 concurrent calls (0.89 → 0.77 ms,
# measured against the zero engine). The garbage freed is the same; collections are fewer.
_GC_YOUNG = 50_000


def _tune_gc() -> None:
    """Once serving starts: what import and start-up built lives as long as the process, so it
    leaves the collector's generations (`gc.freeze`), and young collections run less often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG, older, oldest)


def serve(config: GatewayConfig) -> None:
    """Run in the foreground (the `envhub gateway` command)."""
    app = create_app(config)
    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    app.state.gw.url = (config.public_url or f"http://{config.host}:{port}").rstrip("/")
    print(f"envhub gateway on http://{config.host}:{port}  model={config.served_name()}  "
          f"backend={config.backend}  pool={config.db}", flush=True)
    _tune_gc()
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                  timeout_keep_alive=KEEP_ALIVE_S,
                                  timeout_graceful_shutdown=5)).run(sockets=[sock])
