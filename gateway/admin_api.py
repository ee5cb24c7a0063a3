"""Session and operations routes: /sessions..., /health, /metrics.

With an admin key: a session's own key reads and writes only that session (another session's
key gets 403, an unknown key 401), and creating or listing sessions needs the admin key.
Without one (local single-user mode, allowed on loopback only: see GatewayConfig) every caller
is trusted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError

from envhub.gateway.errors import BadRequest, Forbidden, Unauthorized
from envhub.gateway.openai_api import json_response, read_json
from envhub.gateway.pool.leases import op_revoke
from envhub.gateway.pool.store import op_event, op_update_session
from envhub.gateway.pool.trajectory import build_trajectory, session_info
from envhub.gateway.sessions import LiveSession
from envhub.sdk.types import CMAction, RewardEvent, SessionStatus, Signal

router = APIRouter()


class NewSession(BaseModel):
    session_id: str | None = Field(None, max_length=128)
    group_id: str | None = Field(None, max_length=256)
    task_id: str | None = Field(None, max_length=256)
    env: str | None = Field(None, max_length=256)
    sample_index: int = Field(0, ge=0)
    metadata: dict[str, Any] = Field(default_factory=dict)


class CloseSession(BaseModel):
    status: SessionStatus = SessionStatus.done
    reason: str | None = None


def _parse(model: type[BaseModel], body: dict) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        raise BadRequest(f"field '{field}': {err['msg']}", param=field) from None


async def _require_admin(request: Request) -> None:
    gw = request.app.state.gw
    if gw.sessions.admin_key is None or gw.sessions.is_admin(request.state.api_key):
        return
    if request.state.api_key and await gw.sessions.by_key(request.state.api_key) is not None:
        raise Forbidden("a session key cannot do this: this endpoint needs the gateway's "
                        "admin key as a bearer token")
    raise Unauthorized("this endpoint needs the gateway's admin key as a bearer token")


async def _session_for(request: Request, session_id: str) -> LiveSession:
    """The session, if the caller may access it (admin, local mode, or its own key)."""
    sessions = request.app.state.gw.sessions
    token = request.state.api_key
    if sessions.admin_key is None or sessions.is_admin(token):
        return await sessions.get(session_id)
    # a session key: resolved by the key itself, so whether another session exists is not
    # revealed to it (403 either way)
    live = await sessions.by_key(token) if token else None
    if live is None:
        raise Unauthorized("missing or unknown API key: send the session's own key or the "
                           "admin key as a bearer token")
    if live.id != session_id:
        raise Forbidden(f"this key does not belong to that session (it is session {live.id!r}'s "
                        "key); only the admin key reaches other sessions")
    return live


@router.get("/health")
async def health(request: Request) -> Response:
    gw = request.app.state.gw
    backend = await gw.backend.health()
    return json_response({"status": "ok", "model": gw.config.served_name(), "backend": backend})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.gw.metrics.render(),
                    media_type="text/plain; version=0.0.4")


@router.post("/sessions")
async def create_session(request: Request) -> Response:
    await _require_admin(request)
    gw = request.app.state.gw
    spec = _parse(NewSession, await read_json(request))
    live, key = await gw.sessions.create(
        session_id=spec.session_id, group_id=spec.group_id, task_id=spec.task_id, env=spec.env,
        sample_index=spec.sample_index, metadata=spec.metadata)
    url = gw.public_url(request)
    return json_response({"session_id": live.id, "api_key": key, "base_url": f"{url}/v1",
                          "anthropic_base_url": url, "path_base_url": f"{url}/s/{key}/v1"},
                         status=201)


@router.get("/sessions")
async def list_sessions(request: Request, group_id: str | None = None,
                        status: str | None = None, limit: int = 1000,
                        offset: int = 0) -> Response:
    await _require_admin(request)
    if status is not None and status not in SessionStatus.__members__:
        raise BadRequest(f"status must be one of {', '.join(SessionStatus.__members__)}",
                         param="status")
    if not 1 <= limit <= 100_000 or offset < 0:
        raise BadRequest("limit must be in [1, 100000] and offset >= 0", param="limit")
    rows = await asyncio.to_thread(request.app.state.gw.store.list_sessions, group_id, status,
                                   limit, offset)
    return json_response([session_info(r).model_dump(mode="json") for r in rows])


@router.get("/sessions/{session_id}")
async def get_session(request: Request, session_id: str) -> Response:
    live = await _session_for(request, session_id)
    row = await asyncio.to_thread(request.app.state.gw.store.session_row, live.id)
    return json_response(session_info(row).model_dump(mode="json"))


@router.get("/sessions/{session_id}/trajectory")
async def trajectory(request: Request, session_id: str) -> Response:
    live = await _session_for(request, session_id)
    gw = request.app.state.gw

    def build() -> dict:
        row = gw.store.session_row(live.id)
        return build_trajectory(gw.store, row).model_dump(mode="json")

    return json_response(await asyncio.to_thread(build))


@router.post("/sessions/{session_id}/reward")
async def reward(request: Request, session_id: str) -> Response:
    live = await _session_for(request, session_id)
    body = await read_json(request)
    items = body.get("events") if "events" in body else [body]
    if not isinstance(items, list) or not items:
        raise BadRequest("send one reward event or {'events': [...]}", param="events")
    events = [_parse(RewardEvent, e if isinstance(e, dict) else {}) for e in items]
    await request.app.state.gw.store.write(
        *(op_event("rewards", live.id, e.model_dump()) for e in events))
    return json_response({"recorded": len(events)})


@router.post("/sessions/{session_id}/signal")
async def signal(request: Request, session_id: str) -> Response:
    live = await _session_for(request, session_id)
    sig = _parse(Signal, await read_json(request))
    await request.app.state.gw.store.write(op_event("signals", live.id, sig.model_dump()))
    return json_response({"recorded": 1})


@router.post("/sessions/{session_id}/context_action")
async def context_action(request: Request, session_id: str) -> Response:
    """The agent declares a context-management action; it labels the next request."""
    live = await _session_for(request, session_id)
    action = _parse(CMAction, await read_json(request))
    action.source = "declared"
    history = await request.app.state.gw.sessions.history(live)
    async with live.lock:
        history.declared = action
    return json_response({"accepted": True})


@router.post("/sessions/{session_id}/close")
async def close(request: Request, session_id: str) -> Response:
    live = await _session_for(request, session_id)
    spec = _parse(CloseSession, await read_json(request))
    await request.app.state.gw.store.write(op_update_session(
        live.id, status=spec.status.value, reason=spec.reason, closed_at=time.time()),
        op_revoke(live.id))  # another gateway process serving it re-reads the status
    live.status = spec.status.value
    return json_response({"session_id": live.id, "status": spec.status.value})
