"""The registration server of a ServiceHub (protocol: __init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from envhub.orchestrator.services.protocol import Heartbeat, Registered, Registration

if TYPE_CHECKING:
    from envhub.orchestrator.services.hub import ServiceHub


def hub_app(hub: ServiceHub) -> FastAPI:
    app = FastAPI(title="envhub task services", docs_url=None, redoc_url=None)

    @app.exception_handler(RequestValidationError)
    async def _bad(_: Any, e: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(err.get("loc", ())), "msg": str(err.get("msg"))}
                  for err in e.errors()[:5]]
        return JSONResponse({"error": "bad request", "detail": detail}, status_code=400)

    @app.post("/v1/services")
    async def register(reg: Registration) -> Registered:
        return hub.register(reg)

    @app.post("/v1/services/{service_id}/heartbeat", status_code=204)
    async def heartbeat(service_id: str, beat: Heartbeat) -> Response:
        if not hub.beat(service_id, beat):
            return JSONResponse({"error": f"unknown service {service_id}: register again"},
                                status_code=404)
        return Response(status_code=204)

    @app.get("/v1/services")
    async def services() -> list[dict[str, Any]]:
        return hub.listing()

    return app
