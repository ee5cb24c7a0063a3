"""The server thread every envhub HTTP service runs in (sdk/serve.py), on a real socket."""

from __future__ import annotations

import socket
import time
from typing import Any

from envhub.sdk.serve import serve_in_thread

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def response(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"ok"):
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    return data


def test_an_idle_connection_outlives_the_clients_pool_expiry() -> None:
    """httpx keeps an idle pooled connection 5 s. A server closing its side at the same 5 s
    (uvicorn's default) races the client's next request on it: a ReadError, and with 400
    rollouts in flight 21 of them became env_failure. The connection is still served after 6 s
    idle."""
    with serve_in_thread(ok) as running:
        host, port = running.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(REQUEST)
            assert response(sock).startswith(b"HTTP/1.1 200")
            time.sleep(6)
            sock.sendall(REQUEST)
            assert response(sock).startswith(b"HTTP/1.1 200")
