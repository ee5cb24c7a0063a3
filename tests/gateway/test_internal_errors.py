"""A 500 tells the client nothing of its cause: a generic message and an error id, and that
id is in the server's log next to the full traceback (so an operator can find the cause)."""

from __future__ import annotations

import logging
import re
import sqlite3
from pathlib import Path

import anthropic
import openai
import pytest

from envhub.gateway.server import GatewayHandle
from tests.gateway.conftest import client, start
from tests.support import scripted_backend

LEAKS = ("turns", "sqlite", "OperationalError", "Traceback", "no such table", ".py", "/tmp")


@pytest.fixture
def broken_pool(tmp_path: Path) -> GatewayHandle:
    """A gateway whose pool lost its `turns` table after start-up: every turn's write fails
    with an exception the gateway does not expect."""
    gw = start(tmp_path, scripted_backend(["fine"]))
    with sqlite3.connect(tmp_path / "pool.db") as db:
        db.execute("DROP TABLE turns")
    yield gw
    gw.close()


def error_id_logged(message: str, caplog: pytest.LogCaptureFixture) -> None:
    assert not any(word in message for word in LEAKS), message
    match = re.search(r"err_[0-9a-f]{16}", message)
    assert match, message
    records = [r for r in caplog.records if match.group(0) in r.getMessage()]
    assert records and records[0].exc_info, "the error id is logged with its traceback"
    assert "no such table" in str(records[0].exc_info[1])


def test_openai_route_500_hides_the_cause(broken_pool, caplog):
    caplog.set_level(logging.ERROR, logger="envhub.gateway")
    oa = openai.OpenAI(base_url=f"{broken_pool.url}/v1", api_key="s500-a", max_retries=0)
    with pytest.raises(openai.InternalServerError) as info:
        oa.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])
    body = info.value.response.json()["error"]
    assert body["type"] == "server_error" and body["code"] == "internal_error"
    assert info.value.response.headers["x-envhub-error-id"] in body["message"]
    error_id_logged(body["message"], caplog)


def test_anthropic_route_500_hides_the_cause(broken_pool, caplog):
    caplog.set_level(logging.ERROR, logger="envhub.gateway")
    with pytest.raises(anthropic.InternalServerError) as info:
        client(broken_pool, "s500-b").messages.create(
            model="default", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    body = info.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    error_id_logged(body["error"]["message"], caplog)


def test_an_engine_failure_is_a_503_that_names_no_instance(tmp_path, caplog):
    """An engine that cannot be reached: the client gets a 503 to retry with an error id; the
    engine's URL (its instance name) and the transport's message are in the log only."""
    import socket

    from envhub.gateway.backends.vllm import VLLMBackend

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    caplog.set_level(logging.WARNING, logger="envhub.gateway")
    gw = start(tmp_path, VLLMBackend(dead, timeout=5.0))
    try:
        oa = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="s503", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            oa.chat.completions.create(model="default",
                                       messages=[{"role": "user", "content": "hi"}])
    finally:
        gw.close()
    response = info.value.response
    message = response.json()["error"]["message"]
    assert response.status_code == 503 and "retry" in message
    assert "127.0.0.1" not in message and "unreachable" not in message, message
    error_id = response.headers["x-envhub-error-id"]
    assert error_id in message
    logged = [r.getMessage() for r in caplog.records if error_id in r.getMessage()]
    assert logged and dead in logged[0], "the cause, with the instance, is in the log"
