"""A rollout cancelled while its session is being opened (the run stopping: `envhub train`
cancels the rollouts in flight at its last step) must not leave that session open in the pool.
The gateway creates the session before its answer reaches the runner; a runner that gave up
on the answer never knew the session's id, so nothing closed it: CI's resume test found one
open at the end of a resumed run. Against a real gateway, behind a loopback relay that holds
(or drops) the gateway's answer to `POST /sessions` until the test says so."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from envhub.orchestrator.groups.gateway_link import GatewayLink
from envhub.orchestrator.groups.plan import RolloutKey
from envhub.trainer.source import HttpSource
from tests.support import gateway_in_thread, scripted_backend

ADMIN = "open-session-admin"


class HeldAnswers:
    """A TCP relay to the gateway: bytes go through as they come, except the answer to a
    `POST /sessions`, held until `release()` (then passed on) or `drop()` (the connection is
    cut: the runner gets no answer). `held` is set once such an answer has arrived, i.e. the
    gateway has created the session."""

    def __init__(self, target: str) -> None:
        self.host, port = target.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)
        self.held = asyncio.Event()
        self._go = asyncio.Event()
        self._drop = False
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> HeldAnswers:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def release(self) -> None:
        self._go.set()

    def drop(self) -> None:
        self._drop = True
        self._go.set()

    async def _serve(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.port)
        opening = asyncio.Event()

        async def up() -> None:
            while data := await client_r.read(65536):
                if data.startswith(b"POST /sessions "):
                    opening.set()
                server_w.write(data)
                await server_w.drain()

        async def down() -> None:
            while data := await server_r.read(65536):
                if opening.is_set():
                    self.held.set()
                    await self._go.wait()
                    if self._drop:
                        return
                client_w.write(data)
                await client_w.drain()

        pipes = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pipes:
                p.cancel()
            for w in (client_w, server_w):
                with contextlib.suppress(OSError):
                    w.close()


def sessions(url: str, group_id: str) -> list[tuple[str, str | None]]:
    with HttpSource(url, ADMIN) as pool:
        return [(s.status.value if hasattr(s.status, "value") else str(s.status), s.reason)
                for s in pool.sessions(group_id=group_id)]


@pytest.fixture
def gw(tmp_path):
    handle = gateway_in_thread(tmp_path, scripted_backend(["ok"]), admin_key=ADMIN)
    yield handle
    handle.close()


async def held_open(relay: HeldAnswers, group_id: str) -> asyncio.Future:
    """A rollout's session opening through `relay`, once the gateway has created the session
    and its answer is held on the way."""
    link = GatewayLink.connect(relay.url, ADMIN)
    opening = asyncio.ensure_future(link.open_session(group_id, RolloutKey("arith", "t0", 0)))
    await relay.held.wait()
    return opening


def test_a_rollout_cancelled_while_its_session_opens_closes_that_session(gw) -> None:
    async def scenario() -> None:
        async with HeldAnswers(gw.url) as relay:
            opening = await held_open(relay, "g-cancelled")
            assert await asyncio.to_thread(sessions, gw.url, "g-cancelled") == [
                ("open", None)]
            opening.cancel()
            relay.release()
            with pytest.raises(asyncio.CancelledError):
                await opening

    asyncio.run(scenario())
    assert sessions(gw.url, "g-cancelled") == [("env_failure", "interrupted")]


def test_a_session_whose_answer_was_lost_is_closed_and_the_open_fails(gw) -> None:
    async def scenario() -> None:
        async with HeldAnswers(gw.url) as relay:
            opening = await held_open(relay, "g-lost")
            relay.drop()
            with pytest.raises(httpx.TransportError):
                await opening

    asyncio.run(scenario())
    [(status, reason)] = sessions(gw.url, "g-lost")
    assert status == "env_failure" and reason and reason.startswith(
        "its opening got no answer"), reason
