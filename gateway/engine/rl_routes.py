"""vLLM's RL routes on `envhub engine`, with vLLM 0.32's paths, bodies and answers (a real vLLM
serves them in dev mode, `VLLM_SERVER_DEV_MODE=1`), so one client (backends/vllm.py) drives
both:

    POST /pause?mode=wait|keep      new completions wait at a gate; `wait` answers once the
                                    running ones finished. vLLM's default `abort` is refused
                                    (400): this engine cannot cancel a running batch.
    POST /resume                    open the gate
    GET  /is_paused                 {"is_paused": bool}
    POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}
                                    swap in the weights at DIR (the weight version is kept;
                                    other methods are refused with 400)
    POST /update_weight_version {"new_version": "5"}
    GET  /weight_info               {"weight_version": "5"}
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from envhub.gateway.errors import BadRequest

if TYPE_CHECKING:
    from envhub.gateway.engine.server import ServedEngine

router = APIRouter()


class PauseGate:
    """Completions pass through `admit()`; while paused they wait there for `/resume`."""

    def __init__(self) -> None:
        self.paused = False
        self.running = 0
        self.held = 0  # completions waiting at the gate (`requests_held` in /stats, /metrics)
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        if self.paused:
            self.held += 1
            try:
                while self.paused:
                    await self._open.wait()
            finally:
                self.held -= 1
        self.running += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.running -= 1
            if self.running == 0:
                self._idle.set()

    async def pause(self, wait: bool) -> None:
        self.paused = True
        self._open.clear()
        if wait:
            await self._idle.wait()

    def resume(self) -> None:
        self.paused = False
        self._open.set()


class RpcBody(BaseModel):
    """vLLM's body: string args and kwargs only (callees deserialize what they need)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    method: str
    args: list[str] = []
    call_kwargs: dict[str, str] = Field(default_factory=dict, alias="kwargs")
    timeout: float | None = None


class VersionBody(BaseModel):
    new_version: str


def _engine(request: Request) -> ServedEngine:
    engine: ServedEngine = request.app.state.engine
    return engine


def _gate(request: Request) -> PauseGate:
    gate: PauseGate = request.app.state.pause_gate
    return gate


@router.post("/pause")
async def pause(request: Request, mode: str = "abort") -> dict[str, Any]:
    if mode not in ("wait", "keep"):
        raise BadRequest(f"pause mode {mode!r} is not supported by envhub engine: use "
                         "mode=wait (running requests finish) or mode=keep", param="mode")
    await _gate(request).pause(wait=mode == "wait")
    return {"status": "paused"}


@router.post("/resume")
async def resume(request: Request) -> dict[str, Any]:
    _gate(request).resume()
    return {"status": "resumed"}


@router.get("/is_paused")
async def is_paused(request: Request) -> dict[str, Any]:
    return {"is_paused": _gate(request).paused}


@router.post("/collective_rpc")
async def collective_rpc(body: RpcBody, request: Request) -> dict[str, Any]:
    if body.method != "reload_weights":
        raise BadRequest(f"envhub engine serves collective_rpc method 'reload_weights' only, "
                         f"not {body.method!r}", param="method")
    path = body.call_kwargs.get("weights_path")
    if not path:
        raise BadRequest("reload_weights needs kwargs.weights_path (a model folder)",
                         param="kwargs.weights_path")
    engine = _engine(request)
    await engine.load_weights(path, engine.weight_version)
    return {"results": [None]}


@router.post("/update_weight_version")
async def update_weight_version(body: VersionBody, request: Request) -> dict[str, Any]:
    raw = body.new_version.strip()
    if not raw.lstrip("-").isdigit():
        raise BadRequest(f"envhub engine numbers weight versions: {body.new_version!r} is not "
                         "an integer", param="new_version")
    await _engine(request).set_weight_version(int(raw))
    return {"success": True, "new_version": body.new_version}


@router.get("/weight_info")
async def weight_info(request: Request) -> dict[str, Any]:
    return {"weight_version": str(_engine(request).weight_version)}
