"""The host end of an in-sandbox agent's channel against a real gateway, through its Unix
socket with the official clients: only the session's /v1 routes pass, every credential the
agent sends is replaced by its session's key, streaming works, and bad request heads get a
clear 4xx, never a hang."""

from __future__ import annotations

import asyncio
import socket

import httpx
import openai
import pytest

from envhub.envs.agents.channel import PLACEHOLDER_KEY, SessionChannel
from envhub.sdk import Session
from tests.envs.runtime_fixtures.gateway import ADMIN_KEY, start_gateway
from tests.support import trajectory_json


@pytest.fixture
def gateway(tmp_path):
    handle, _ = start_gateway(tmp_path, ["One.", "Two.", "Three."])
    yield handle
    handle.close()


def with_channel(gw, tmp_path, body):
    """Run `body(socket_path, session)` (blocking, in a thread) while a channel serves."""
    session = Session.open(gw.url, admin_key=ADMIN_KEY, task_id="t")

    async def main():
        channel = await SessionChannel(tmp_path / "ch", gw.url, session.api_key).start()
        try:
            return await asyncio.to_thread(body, str(channel.socket_path), session), channel
        finally:
            await channel.close()

    try:
        return asyncio.run(main())
    finally:
        session.close()


def test_session_routes_pass_with_the_session_key_whatever_the_agent_sends(gateway, tmp_path):
    def body(path, session):
        http = httpx.Client(transport=httpx.HTTPTransport(uds=path))
        client = openai.OpenAI(base_url="http://127.0.0.1:4141/v1", api_key=PLACEHOLDER_KEY,
                               http_client=http, max_retries=0)
        first = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
        chunks = list(client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "again"}], max_tokens=8,
            stream=True))
        refused = {p: http.get(f"http://x{p}").status_code
                   for p in ("/sessions", f"/sessions/{session.id}/trajectory",
                             f"/s/{session.id}/v1/models", "/v1/../sessions", "/health")}
        turns = trajectory_json(gateway, session.id, ADMIN_KEY)["turns"]
        return first.choices[0].message.content, len(chunks), refused, len(turns)

    (content, chunks, refused, turns), channel = with_channel(gateway, tmp_path, body)
    assert content and chunks >= 1
    assert turns == 2  # both calls recorded in this session
    assert set(refused.values()) == {403}, refused
    assert channel.requests == 2 and channel.refused == len(refused)
    assert not (tmp_path / "ch").exists()  # closed: socket and folder gone


def test_bad_request_heads_get_a_4xx_not_a_hang(gateway, tmp_path):
    def raw(path, data: bytes) -> bytes:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(20)
            s.connect(path)
            s.sendall(data)
            return s.recv(200)

    def body(path, _session):
        return (raw(path, b"GET /v1/models HTTP/1.1\r\nX: " + b"a" * (70 << 10) + b"\r\n\r\n"),
                raw(path, b"NONSENSE\r\n\r\n"),
                raw(path, b"GET /v1/models SPDY/3\r\n\r\n"))

    (big, nonsense, version), _ = with_channel(gateway, tmp_path, body)
    assert big.startswith(b"HTTP/1.1 431")
    assert nonsense.startswith(b"HTTP/1.1 403") and version.startswith(b"HTTP/1.1 403")


def test_channel_refuses_a_gateway_it_cannot_reach_over_plain_http(tmp_path):
    with pytest.raises(ValueError, match="http://"):
        SessionChannel(tmp_path, "https://example.org", "k")


def test_connections_that_never_speak_are_bounded_in_number_and_time(gateway, tmp_path):
    """An agent opening connections and sending nothing: past the cap each new one is told 429
    at once, and every silent one is answered 408 and closed after the head timeout; a real
    request still goes through afterwards."""
    session = Session.open(gateway.url, admin_key=ADMIN_KEY, task_id="t")

    def flood(path: str) -> tuple[list[bytes], list[bytes], int]:
        silent = []
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(20)
            s.connect(path)
            silent.append(s)
        extra = []
        for _ in range(2):
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(20)
                s.connect(path)
                extra.append(s.recv(200))  # answered at once, before any timeout
        timed_out = [s.recv(200) for s in silent]
        for s in silent:
            s.close()
        transport = httpx.HTTPTransport(uds=path)
        with httpx.Client(transport=transport, base_url="http://sandbox") as http:
            ok = http.get("/v1/models").status_code
        return extra, timed_out, ok

    async def main():
        channel = await SessionChannel(tmp_path / "ch", gateway.url, session.api_key,
                                       max_connections=3, head_timeout_s=5.0).start()
        try:
            return await asyncio.to_thread(flood, str(channel.socket_path)), channel
        finally:
            await channel.close()

    try:
        (extra, timed_out, ok), channel = asyncio.run(main())
    finally:
        session.close()
    assert all(r.startswith(b"HTTP/1.1 429") for r in extra), extra
    assert all(r.startswith(b"HTTP/1.1 408") for r in timed_out), timed_out
    assert ok == 200 and channel.open == 0 and channel.requests == 1
