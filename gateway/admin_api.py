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

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, RootModel

from envhub.gateway.errors import POOL_RETRY_AFTER_S, Forbidden, Unauthorized
from envhub.gateway.models.base import OPENAI_ERRORS, body_of, parse
from envhub.gateway.openai_api import json_response, read_json
from envhub.gateway.pool.declared import Declaration
from envhub.gateway.pool.leases import op_revoke
from envhub.gateway.pool.store import op_event, op_update_session
from envhub.gateway.pool.trajectory import build_trajectory, session_info
from envhub.gateway.sessions import LiveSession
from envhub.sdk.types import RUNNER, CMAction, RewardEvent, SessionStatus, Signal

router = APIRouter(responses=OPENAI_ERRORS)


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


class RewardBatch(BaseModel):
    events: list[RewardEvent] = Field(min_length=1)


class RewardBody(RootModel[RewardEvent | RewardBatch]):
    """One reward event, or several as {'events': [...]}."""


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
    """200 `ok` while the gateway can serve and record; 503 `not_ready` naming the pool's
    fault (disk full, database unreachable) while its writes fail: a write probe (one at a
    time) decides, so readiness comes back by itself once the pool can write again."""
    gw = request.app.state.gw
    backend = await gw.backend.health()
    body = {"status": "ok", "model": gw.config.served_name(), "backend": backend}
    if gw.store.fault is not None:
        fault = await gw.store.probe()
        if fault is not None:
            return json_response({**body, "status": "not_ready", "pool": fault}, status=503,
                                 headers={"retry-after": str(round(POOL_RETRY_AFTER_S))})
    return json_response(body)


@router.get("/metrics", responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request) -> Response:
    return Response(request.app.state.gw.metrics.render(),
                    media_type="text/plain; version=0.0.4")


@router.post("/sessions", status_code=201, openapi_extra=body_of(NewSession))
async def create_session(request: Request) -> Response:
    await _require_admin(request)
    gw = request.app.state.gw
    spec = parse(NewSession, await read_json(request))
    live, key = await gw.sessions.create(
        session_id=spec.session_id, group_id=spec.group_id, task_id=spec.task_id, env=spec.env,
        sample_index=spec.sample_index, metadata=spec.metadata)
    url = gw.public_url(request)
    return json_response({"session_id": live.id, "api_key": key, "base_url": f"{url}/v1",
                          "anthropic_base_url": url, "path_base_url": f"{url}/s/{key}/v1"},
                         status=201)


@router.get("/sessions")
async def list_sessions(request: Request, group_id: str | None = None,
                        status: SessionStatus | None = None,
                        limit: int = Query(1000, ge=1, le=100_000),
                        offset: int = Query(0, ge=0)) -> Response:
    await _require_admin(request)
    rows = await asyncio.to_thread(request.app.state.gw.store.list_sessions, group_id,
                                   status.value if status is not None else None,
                                   limit, offset)
    return json_response([session_info(r).model_dump(mode="json") for r in rows])


@router.get("/sessions/{session_id}")
async def get_session(request: Request, session_id: str) -> Response:
    live = await _session_for(request, session_id)
    store = request.app.state.gw.store
    row = await store.read(store.session_row, live.id)
    return json_response(session_info(row).model_dump(mode="json"))


@router.get("/sessions/{session_id}/trajectory")
async def trajectory(request: Request, session_id: str) -> Response:
    live = await _session_for(request, session_id)
    gw = request.app.state.gw

    def build() -> dict:
        row = gw.store.session_row(live.id)
        return build_trajectory(gw.store, row).model_dump(mode="json")

    return json_response(await asyncio.to_thread(build))


async def _runner_only(request: Request, session_id: str) -> LiveSession:
    """The session, for a write only the runner makes (rewards, signals, the close): with an
    admin key configured, the admin key; the session's own key, which its agent holds, is
    refused (403): an agent could score itself, feed the process reward (and any component of
    the environment's that reads signals), or close itself as env_failure to be dropped from
    training. Without an admin key (single-user mode) every token reaches every session anyway.
    CM actions stay open to the session's key (agents declare them through the SDK): a
    declaration only labels the next turn (see `context_action`) and no reward reads it."""
    await _require_admin(request)
    return await request.app.state.gw.sessions.get(session_id)


@router.post("/sessions/{session_id}/reward", openapi_extra=body_of(RewardBody))
async def reward(request: Request, session_id: str) -> Response:
    live = await _runner_only(request, session_id)
    body = await read_json(request)
    events = parse(RewardBatch, body).events if "events" in body else [parse(RewardEvent, body)]
    # provenance the writer cannot set: only the runner reaches this route (the trainer keeps
    # only events stamped so, whatever else lands in a shared pool)
    await request.app.state.gw.store.write(
        *(op_event("rewards", live.id, {**e.model_dump(), "writer": RUNNER}) for e in events))
    return json_response({"recorded": len(events)})


@router.post("/sessions/{session_id}/signal", openapi_extra=body_of(Signal))
async def signal(request: Request, session_id: str) -> Response:
    """A process signal (tool_error, ...): the runner's, with the admin key; the built-in
    agent posts through the runner's session, which holds it."""
    live = await _runner_only(request, session_id)
    sig = parse(Signal, await read_json(request))
    await request.app.state.gw.store.write(op_event("signals", live.id, sig.model_dump()))
    return json_response({"recorded": 1})


@router.post("/sessions/{session_id}/context_action", openapi_extra=body_of(CMAction))
async def context_action(request: Request, session_id: str) -> Response:
    """The agent declares a context-management action; it labels the next request. Open to
    the session's key: the segment split and the chain stay the gateway's own detection, and
    where the action sits (seq, segment, the turn it left) is filled in by the gateway, so a
    declaration changes a label, never the trained tokens or a reward."""
    live = await _session_for(request, session_id)
    action = parse(CMAction, await read_json(request)).model_copy(
        update={"source": "declared", "seq": None, "segment": None, "from_seq": None})
    async with live.lock:
        # into the pool, so that whichever gateway process serves the next request applies it
        # (pool/declared.py); this process's cached history too when it holds the session
        history = live.history
        declaration = Declaration(live.id, action.model_dump(),
                                  history.lease if history is not None else None)
        await request.app.state.gw.store.write(declaration.op)
        if history is not None and live.history is history and (
                declaration.held or history.lease is None):
            history.declared = CMAction(**declaration.body)
    return json_response({"accepted": True})


@router.get("/sessions/{session_id}/pool_faults")
async def pool_faults(request: Request, session_id: str) -> Response:
    """How many of this session's calls this gateway process refused because the pool could
    not record them (503), and the last reason: counted in memory (the pool is what failed),
    for the runner to tell the agent's failures from the pool's. The admin key, or the
    session's own (a count the agent cannot change: only the pool's failures move it)."""
    sessions = request.app.state.gw.sessions
    token = request.state.api_key
    if sessions.admin_key is None or sessions.is_admin(token):
        live = sessions.cached_id(session_id)
    else:  # the session's own key (a runner on another node holds only that): its own count
        live = sessions.cached(token)
        if live is None or live.id != session_id:
            raise Forbidden("only the admin key, or the session's own key on the gateway "
                            "process that holds it, reads a session's pool refusals")
    return json_response({"session_id": session_id,
                          "refused": live.pool_refused if live is not None else 0,
                          "reason": live.pool_fault if live is not None else None})


@router.post("/sessions/{session_id}/close", openapi_extra=body_of(CloseSession))
async def close(request: Request, session_id: str) -> Response:
    live = await _runner_only(request, session_id)
    spec = parse(CloseSession, await read_json(request))
    await request.app.state.gw.store.write(op_update_session(
        live.id, status=spec.status.value, reason=spec.reason, closed_at=time.time()),
        op_revoke(live.id))  # another gateway process serving it re-reads the status
    live.status = spec.status.value
    return json_response({"session_id": live.id, "status": spec.status.value})
