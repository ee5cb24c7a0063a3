"""Fake engine servers that answer in exactly the documented shapes of engines we cannot run
here (SGLang, hosted OpenAI-compatible APIs). Product code: tests, benchmarks and demos use
them as real HTTP servers on loopback.

    with serve_in_thread(sglang_app()) as server:     # server.url = http://127.0.0.1:PORT
        ...
    python -m envhub.gateway.fakes sglang --port 30000
    python -m envhub.gateway.fakes openai --port 8001

Each fake also serves `POST /fake/fail {"count": n, "status": 500}` (the next n generation
calls answer that status) and `GET /fake/requests` (what it received), for failure tests;
the SGLang fake also `POST /fake/slow_health {"delay": s}` (an overloaded engine's late
heartbeats).
"""

from __future__ import annotations

from envhub.sdk.serve import ServerThread, serve_in_thread

FakeServer = ServerThread  # the name tests and benchmarks use

__all__ = ["FakeServer", "serve_in_thread"]
