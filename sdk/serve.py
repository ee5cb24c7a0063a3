"""Serve an ASGI app with uvicorn on a background thread.

The gateway's `run_in_thread`, the fake engines (gateway/fakes) and the fake E2B server start
this way in tests, benchmarks and in-process runners:

    with serve_in_thread(app) as server:  # port 0: a free port; server.url = http://host:port
        ...

uvicorn is imported when a server starts, so `import envhub.sdk` stays light.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Self

if TYPE_CHECKING:
    import uvicorn

__all__ = ["ServerThread", "bind", "serve_in_thread"]


@dataclass
class ServerThread:
    """A running server; `close()` (or leaving the `with` block) stops it and joins the
    thread."""

    url: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread

    def close(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# How long an idle client connection stays open. Above the clients' own idle limit (httpx's
# pool keeps one 5 s): at uvicorn's default, also 5 s, a client reused a connection the server
# was closing that instant, and its request failed with a ReadError (seen with 400 rollouts in
# flight on a loaded machine: 21 of 400 became env_failure).
KEEP_ALIVE_S = 75


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on (host, port); port 0 picks a free one. Binding before
    uvicorn starts tells the caller the port without a race against other processes."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0, *,
                    lifespan: Literal["on", "off", "auto"] = "off",
                    graceful_timeout: int | None = None, name: str = "envhub-server",
                    start_timeout: float = 30.0,
                    on_stop: Callable[[], Awaitable[None]] | None = None,
                    loop: Literal["auto", "asyncio"] = "auto") -> ServerThread:
    """Serve `app` on a daemon thread; returns once it accepts connections.

    `on_stop` runs on the server's event loop after the server stopped (resources bound to
    that loop, e.g. subprocesses the app started, must be closed there). `loop`: "auto" is
    uvloop when installed; an app that starts subprocesses wants "asyncio", because uvloop's
    children inherit the originals of the stdio given to them and every fd the process holds
    without close-on-exec (`close_fds` is not applied), so a child's leftover processes hold
    its pipes open."""
    import uvicorn

    sock = bind(host, port)
    url = f"http://{host}:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan,
                                           timeout_graceful_shutdown=graceful_timeout,
                                           timeout_keep_alive=KEEP_ALIVE_S, loop=loop))

    async def run() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            if on_stop is not None:
                await on_stop()

    def thread_main() -> None:
        # The loop uvicorn would pick itself (uvloop when installed): the gateway's hot path.
        factory = getattr(server.config, "get_loop_factory", lambda: None)()
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(run())

    thread = threading.Thread(target=thread_main, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"{name} did not start on {host}:{port}; see the log above")
        time.sleep(0.01)
    return ServerThread(url, app, server, thread)
