"""A client that hangs up mid-call cancels the engine call; the session stays usable and the
history is not left marked as extended (the agent's retry continues the same segment)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import httpx
import openai

from envhub.gateway.backends.base import GenerateRequest, GenerateResult
from tests.gateway.conftest import start
from tests.support import until


class SlowBackend:
    """Answers after `delay` seconds; records cancellations (the engine's abort)."""

    name = "slow"

    def __init__(self, renderer, delay: float):
        self.renderer, self.delay = renderer, delay
        self.cancelled = 0
        self.calls = 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.calls += 1
        try:
            await asyncio.sleep(self.delay if self.calls == 1 else 0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        ids = self.renderer.encode("fine") + [self.renderer.stop_token_ids[0]]
        return GenerateResult(ids, [-0.5] * len(ids), "stop", 0, "slow")

    async def health(self) -> dict:
        return {}

    async def aclose(self) -> None:
        pass


def test_hangup_cancels_engine_call(tmp_path, renderer):
    backend = SlowBackend(renderer, delay=30)
    gw = start(tmp_path, backend)
    try:
        body = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
        # the client hangs up once the engine call is under way (not on a timer a loaded
        # machine can outrun: a hang-up before it starts has nothing to cancel)
        url = httpx.URL(gw.url)
        payload = json.dumps(body).encode()
        with socket.create_connection((url.host, url.port), timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
                      b"authorization: Bearer hang\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
            assert until(lambda: backend.calls == 1)
        assert until(lambda: backend.cancelled == 1)
        # the agent retries: a normal first turn of the same segment, nothing half-recorded
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="hang", max_retries=0)
        assert c.chat.completions.create(**body).choices[0].message.content == "fine"
        t = httpx.get(f"{gw.url}/sessions/hang/trajectory").json()
        assert len(t["turns"]) == 1 and t["cm_actions"] == []
    finally:
        gw.close()


def test_a_client_gone_before_its_body_is_read_is_no_error(tmp_path, renderer, caplog):
    """An agent killed while sending (Ctrl-C on a run: every agent gets the signal) leaves a
    body half sent: the gateway has nobody to answer and nothing to record, so it logs no error
    and no traceback, and the next call is served."""
    backend = SlowBackend(renderer, delay=0)
    gw = start(tmp_path, backend)
    try:
        url = httpx.URL(gw.url)
        payload = json.dumps({"model": "default", "messages": [
            {"role": "user", "content": "hi"}]}).encode()
        for path in (b"/v1/chat/completions", b"/v1/messages", b"/v1/responses"):
            with socket.create_connection((url.host, url.port), timeout=30) as s:
                s.sendall(b"POST %s HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer gone\r\n"
                          b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                          % (path, len(payload), payload[:len(payload) // 2]))
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="gone", max_retries=0)
        assert c.chat.completions.create(model="default", messages=[
            {"role": "user", "content": "hi"}]).choices[0].message.content == "fine"
        # the three half-sent requests have ended on the gateway's side, each a 499 (nginx's
        # "client closed request") in the request counter
        assert until(lambda: sum(
            line.startswith("envhub_requests_total{") and 'status="499"' in line
            for line in httpx.get(f"{gw.url}/metrics").text.splitlines()) == 3)
    finally:
        gw.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == [], [r.getMessage() for r in errors]
    assert backend.calls == 1
