"""A client that hangs up mid-call cancels the engine call; the session stays usable and the
history is not left marked as extended (the agent's retry continues the same segment)."""

from __future__ import annotations

import asyncio
import json
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
