"""A fake E2B (control-plane API + in-sandbox `envd`) for running the official `e2b` SDK
without the cloud: tests, CI and offline development.

Sandboxes are LocalSandboxes (bubblewrap when installed) whose workdir is /home/user; as root,
each is one set of namespaces that all its commands join, as E2B's microVM is one machine
(state.py).
Point the SDK at it with

    E2B_API_URL=http://127.0.0.1:PORT  E2B_SANDBOX_URL=http://127.0.0.1:PORT
    E2B_API_KEY=<the key the fake was started with>  E2B_HTTP_VERSION=1.1

(one server answers both; the SDK tells sandboxes apart by its E2b-Sandbox-Id header).
Run it standalone with `python -m envhub.envs.sandbox.e2b_fake --port 3000`, or in-process:

    with running_fake_e2b(api_key="test") as url: ...

What is faked: create / list / info / kill / set-timeout (with expiry), the envd file
download/upload API, and `process.Process` Start / SendSignal / List. Output of a command is
streamed as it is written. Not faked: the `filesystem.Filesystem`
RPCs (UNIMPLEMENTED), pause/resume/snapshots, templates, PTY, stdin, metrics, logs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from starlette.applications import Starlette

from envhub.envs.sandbox.e2b_fake import control, envd
from envhub.envs.sandbox.e2b_fake.state import Registry
from envhub.sdk.serve import serve_in_thread

__all__ = ["FakeE2B", "running_fake_e2b"]


class FakeE2B:
    """The ASGI application: Connect RPC paths go to the SDK-generated service apps, the rest
    to the REST routes (control plane and envd HTTP)."""

    def __init__(self, api_key: str | None = None, allow_network: bool = False) -> None:
        self.registry = Registry(allow_network=allow_network)
        self.rpc = envd.rpc_apps(self.registry)
        self.http = Starlette(routes=control.routes(self.registry, api_key)
                              + envd.routes(self.registry))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for prefix, app in self.rpc.items():
                if scope["path"].startswith(prefix):
                    await app(scope, receive, send)  # type: ignore[operator]
                    return
        await self.http(scope, receive, send)


@contextlib.contextmanager
def running_fake_e2b(api_key: str | None = "e2b_fake_key", host: str = "127.0.0.1",
                     port: int = 0) -> Iterator[str]:
    """Serve a FakeE2B in a background thread; yields its base URL. On exit every sandbox it
    still holds is killed (on the server's loop, which owns their processes) and the server
    stops."""
    app = FakeE2B(api_key=api_key)
    try:
        server = serve_in_thread(app, host, port, name="fake-e2b",
                                 on_stop=app.registry.close, loop="asyncio")
    except RuntimeError as exc:
        raise RuntimeError(f"the fake E2B server could not start on {host}:{port}") from exc
    try:
        yield server.url
    finally:
        server.close(timeout=15)
