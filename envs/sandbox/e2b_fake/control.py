"""The E2B control-plane REST API (api.e2b.app) for the calls the Python SDK makes:
create (POST /v2/sandboxes), list (GET /v2/sandboxes), info (GET /sandboxes/{id}),
kill (DELETE /sandboxes/{id}), set timeout (POST /sandboxes/{id}/timeout).
Errors use the API's shape `{"code": <status>, "message": "..."}`."""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from envhub.envs.sandbox.e2b_fake.state import ENVD_VERSION, Registry, now

DEFAULT_TIMEOUT_S = 300
MAX_TIMEOUT_S = 86_400


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def routes(registry: Registry, api_key: str | None) -> list[Route]:
    def authorized(request: Request) -> bool:
        return api_key is None or request.headers.get("x-api-key") == api_key

    async def create(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Invalid API key, set E2B_API_KEY")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return error(400, "body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("templateID"), str):
            return error(400, "templateID (string) is required")
        timeout = body.get("timeout", DEFAULT_TIMEOUT_S)
        if not isinstance(timeout, int) or not 0 < timeout <= MAX_TIMEOUT_S:
            return error(400, f"timeout must be an integer in 1..{MAX_TIMEOUT_S} seconds")
        sandbox = await registry.create(body["templateID"], timeout,
                                        dict(body.get("metadata") or {}),
                                        dict(body.get("envVars") or {}))
        return JSONResponse({
            "templateID": sandbox.template, "sandboxID": sandbox.id, "clientID": "fake",
            "envdVersion": ENVD_VERSION, "envdAccessToken": sandbox.access_token,
            "alias": sandbox.template, "domain": None,
        }, status_code=201)

    async def list_sandboxes(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Invalid API key, set E2B_API_KEY")
        await registry.expire()
        wanted: dict[str, str] = {}
        raw = request.query_params.get("metadata")
        if raw:
            # The SDK url-encodes `key=quote(value)` pairs into one parameter.
            wanted = {k: urllib.parse.unquote(v) for k, v in urllib.parse.parse_qsl(raw)}
        states = (request.query_params.get("state") or "running").split(",")
        found = [s.listed() for s in registry.sandboxes.values()
                 if "running" in states and all(s.metadata.get(k) == v for k, v in wanted.items())]
        return JSONResponse(found)

    async def info(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Invalid API key, set E2B_API_KEY")
        sandbox = await registry.get(request.path_params["sandbox_id"])
        if sandbox is None:
            return error(404, f"sandbox {request.path_params['sandbox_id']} not found")
        return JSONResponse(sandbox.detail())

    async def kill(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Invalid API key, set E2B_API_KEY")
        if not await registry.kill(request.path_params["sandbox_id"]):
            return error(404, f"sandbox {request.path_params['sandbox_id']} not found")
        return Response(status_code=204)

    async def set_timeout(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Invalid API key, set E2B_API_KEY")
        sandbox = await registry.get(request.path_params["sandbox_id"])
        if sandbox is None:
            return error(404, f"sandbox {request.path_params['sandbox_id']} not found")
        try:
            timeout = json.loads(await request.body())["timeout"]
        except (ValueError, KeyError, TypeError):
            return error(400, 'body must be {"timeout": <seconds>}')
        if not isinstance(timeout, int) or not 0 < timeout <= MAX_TIMEOUT_S:
            return error(400, f"timeout must be an integer in 1..{MAX_TIMEOUT_S} seconds")
        sandbox.end_at = now() + dt.timedelta(seconds=timeout)
        return Response(status_code=204)

    return [
        Route("/v2/sandboxes", create, methods=["POST"]),
        Route("/v2/sandboxes", list_sandboxes, methods=["GET"]),
        Route("/sandboxes/{sandbox_id}", info, methods=["GET"]),
        Route("/sandboxes/{sandbox_id}", kill, methods=["DELETE"]),
        Route("/sandboxes/{sandbox_id}/timeout", set_timeout, methods=["POST"]),
    ]
