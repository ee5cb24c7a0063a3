"""Fleet operations: pause, weight updates, resume, and the fleet's state.

    POST /admin/pause   {"drain": true, "timeout": 60}  new calls wait (bounded by the
                        gateway's pause_wait, then 429 + Retry-After); running calls finish.
                        With drain, answers once nothing is in flight (or the timeout hit).
    POST /admin/weights {"path": "...", "version": 5}   pause, drain, every instance loads
                        the weights, the version becomes 5 (default: current + 1), resume
                        (unless paused before). A vLLM instance (vLLM >= 0.32 started with
                        VLLM_SERVER_DEV_MODE=1; envhub engine serves the same routes) gets
                        `/pause?mode=wait`, `/collective_rpc` reload_weights from the folder,
                        `/update_weight_version`, `/resume`; SGLang gets
                        `/update_weights_from_disk {model_path, weight_version}`.
                        Without `path` (only `version`): record the version of weights
                        pushed out of band, e.g. vLLM's NCCL weight transfer.
    POST /admin/resume
    GET  /admin/fleet   per-instance state: in rotation, version, load, failures, tokens/s.

An instance that fails to load leaves rotation. With the `local` backend, `/admin/weights`
swaps the embedded engine's weights; pause/resume need a fleet.
Every route needs the admin key when the gateway has one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from envhub.gateway.admin_api import _require_admin
from envhub.gateway.errors import BadRequest
from envhub.gateway.models.base import OPENAI_ERRORS, body_of, parse
from envhub.gateway.openai_api import json_response, read_json
from envhub.gateway.router import Fleet

if TYPE_CHECKING:
    from envhub.gateway.server import GatewayState

router = APIRouter(responses=OPENAI_ERRORS)


class PauseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    drain: bool = Field(False, description="answer only once no call is in flight")
    timeout: float = Field(60.0, ge=0, le=3600, description="longest drain wait (s)")


class WeightsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(None, min_length=1,
                             description="checkpoint path as the engines see it; omit to "
                                         "record the version of weights pushed out of band")
    version: int | None = Field(None, ge=0, description="new weight version (default: +1)")
    drain_timeout: float = Field(300.0, ge=0, le=3600,
                                 description="longest wait for running calls (s)")


async def start(state: GatewayState) -> None:
    """Gateway startup: expose the fleet's metrics and start its heartbeats."""
    backend = state.backend
    if isinstance(backend, Fleet):
        backend.metrics.attach(state.metrics.registry)
        await backend.start()


async def stop(state: GatewayState) -> None:
    if isinstance(state.backend, Fleet):
        await state.backend.stop()


def _fleet(request: Request) -> Fleet:
    backend = request.app.state.gw.backend
    if not isinstance(backend, Fleet):
        raise BadRequest(f"the gateway's backend is {backend.name!r}, not a fleet: pause and "
                         "resume need --backend vllm|sglang with --upstream URLs")
    return backend


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    return await read_json(request) if raw.strip() else {}


@router.post("/admin/pause", openapi_extra=body_of(PauseSpec, required=False))
async def pause(request: Request) -> Response:
    await _require_admin(request)
    fleet = _fleet(request)
    spec = parse(PauseSpec, await _body(request))
    fleet.pause()
    drained = await fleet.drain(spec.timeout) if spec.drain else fleet.in_flight == 0
    return json_response({"paused": True, "drained": drained, "in_flight": fleet.in_flight,
                          "weight_version": fleet.weight_version})


@router.post("/admin/resume")
async def resume(request: Request) -> Response:
    await _require_admin(request)
    fleet = _fleet(request)
    fleet.resume()
    return json_response({"paused": False, "weight_version": fleet.weight_version})


@router.post("/admin/weights", openapi_extra=body_of(WeightsSpec))
async def weights(request: Request) -> Response:
    await _require_admin(request)
    spec = parse(WeightsSpec, await read_json(request))
    backend = request.app.state.gw.backend
    if isinstance(backend, Fleet):
        outcome = await backend.update_weights(spec.path, spec.version, spec.drain_timeout)
        return json_response(outcome)
    if spec.path is None:
        raise BadRequest("give the checkpoint `path` to load", param="path")
    # WeightsNotLoadable (a 400 with the reason) when this backend cannot load weights.
    version = await backend.load_weights(spec.path, spec.version)
    return json_response({"weight_version": version, "path": spec.path,
                          "updated": [backend.instance], "failed": {}})


@router.get("/admin/fleet")
async def fleet_state(request: Request) -> Response:
    await _require_admin(request)
    return json_response(_fleet(request).describe())
