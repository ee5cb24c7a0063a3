"""Fake engine servers that answer in exactly the documented shapes of engines we cannot run
here (SGLang, hosted OpenAI-compatible APIs). Product code: tests, benchmarks and demos use
them as real HTTP servers on loopback.

    with serve_in_thread(sglang_app()) as server:     # server.url = http://127.0.0.1:PORT
        ...
    python -m envhub.gateway.fakes sglang --port 30000
    python -m envhub.gateway.fakes openai --port 8001

Each fake also serves `POST /fake/fail {"count": n, "status": 500}` (the next n generation
calls answer that status) and `GET /fake/requests` (what it received), for failure tests.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Self

import uvicorn

__all__ = ["FakeServer", "serve_in_thread"]


@dataclass
class FakeServer:
    url: str
    app: Any
    _server: uvicorn.Server
    _thread: threading.Thread

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> FakeServer:
    """Serve an ASGI app on a background thread; returns once it accepts connections."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    url = f"http://{host}:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="envhub-fake-server")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the fake server did not start")
        time.sleep(0.01)
    return FakeServer(url, app, server, thread)
