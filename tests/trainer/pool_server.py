"""A small server answering the gateway's pool API shapes (the real gateway is built in
parallel): `GET /sessions?group_id=&status=`, `GET /sessions/{id}/trajectory` with the admin
bearer key, and `POST /update_weights_from_disk` that records what it was sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from envhub.sdk.types import Trajectory
from tests.support import free_port


def make_app(trajectories: list[Trajectory], admin_key: str, pushes: list[dict[str, Any]]):
    from fastapi import FastAPI, Header, HTTPException

    app = FastAPI()
    by_id = {t.session.id: t for t in trajectories}

    def auth(authorization: str | None) -> None:
        if authorization != f"Bearer {admin_key}":
            raise HTTPException(401, "admin key required")

    @app.get("/sessions")
    def sessions(group_id: str | None = None, status: str | None = None,
                 authorization: str | None = Header(None)) -> list[dict[str, Any]]:
        auth(authorization)
        out = []
        for t in by_id.values():
            info = t.session.model_copy(update={"status": t.status, "api_key": None})
            if group_id is not None and info.group_id != group_id:
                continue
            if status is not None and info.status.value != status:
                continue
            out.append(info.model_dump(mode="json"))
        return out

    @app.get("/sessions/{sid}/trajectory")
    def trajectory(sid: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        auth(authorization)
        if sid not in by_id:
            raise HTTPException(404, f"no session {sid}")
        return by_id[sid].model_dump(mode="json")

    @app.post("/update_weights_from_disk")
    def update(body: dict[str, Any]) -> dict[str, Any]:
        pushes.append(body)
        return {"success": True, "message": "ok"}

    return app


@contextmanager
def serve(trajectories: list[Trajectory], admin_key: str = "admin-secret"
          ) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Run the app on a loopback port in a thread; yield (base_url, recorded pushes)."""
    import uvicorn

    pushes: list[dict[str, Any]] = []
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(trajectories, admin_key, pushes),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("pool server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", pushes
    finally:
        server.should_exit = True
        thread.join(timeout=10)
