"""Fleet routing, failover, heartbeats, pause and weights against fake SGLang servers (real
HTTP on loopback). The big multi-process runs live in test_fleet_engines.py."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from envhub.gateway.backends.base import GenerateRequest, SamplingParams
from envhub.gateway.backends.sglang import SGLangBackend
from envhub.gateway.config import GatewayConfig
from envhub.gateway.errors import BackendUnavailable, BadRequest
from envhub.gateway.fakes import FakeServer, serve_in_thread
from envhub.gateway.fakes.sglang import FakeSGLang, sglang_app
from envhub.gateway.fleet.instance import Instance
from envhub.gateway.fleet.placement import Placement
from envhub.gateway.router import Fleet
from envhub.gateway.server import run_in_thread

PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


@pytest.fixture
def fakes() -> Iterator[list[FakeServer]]:
    servers = [serve_in_thread(sglang_app(FakeSGLang(length=4))) for _ in range(3)]
    yield servers
    for s in servers:
        s.close()


def fake_of(server: FakeServer) -> FakeSGLang:
    return server.app.state.fake


def make_fleet(servers: list[FakeServer], **kw) -> Fleet:
    members = [SGLangBackend(s.url, instance=f"i{k}") for k, s in enumerate(servers)]
    return Fleet(members, **{"heartbeat_interval": 0.1, "heartbeat_timeout": 2.0, **kw})


def req(session: str, seq: int = 0) -> GenerateRequest:
    return GenerateRequest(PROMPT, SamplingParams(max_tokens=8), f"{session}-{seq}", session)


async def arm(server: FakeServer, count: int, status: int) -> None:
    """The next `count` generation calls to `server` answer HTTP `status`."""
    async with httpx.AsyncClient() as http:
        await http.post(f"{server.url}/fake/fail", json={"count": count, "status": status})


async def wait_until(cond, what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.02)


# -- placement (pure logic) ------------------------------------------------------------------


class _Member:
    name = "fake"
    weight_version = 0

    def __init__(self, instance: str):
        self.instance = instance


def instances(n: int) -> list[Instance]:
    return [Instance(f"i{k}", _Member(f"i{k}"), in_rotation=True) for k in range(n)]  # type: ignore[arg-type]


def test_idle_fleet_spreads_new_sessions_and_keeps_them() -> None:
    insts = instances(3)
    placement = Placement([i.name for i in insts])
    first = {f"s{k}": placement.pick(f"s{k}", insts).name for k in range(300)}
    counts = Counter(first.values())
    assert set(counts) == {"i0", "i1", "i2"} and min(counts.values()) > 60
    assert all(placement.pick(s, insts).name == name for s, name in first.items())
    assert placement.moves == 0


def test_new_session_goes_to_least_loaded() -> None:
    insts = instances(3)
    insts[0].in_flight, insts[1].in_flight, insts[2].in_flight = 5, 1, 3
    assert Placement([i.name for i in insts]).pick("new", insts).name == "i1"


def test_session_moves_only_when_its_instance_is_overloaded_or_gone() -> None:
    insts = instances(3)
    placement = Placement([i.name for i in insts], load_factor=1.5)
    home = placement.pick("s", insts)
    home.in_flight = 50  # a burst of calls does not move a warm session
    assert placement.pick("s", insts) is home and placement.moves == 0
    for k in range(10):  # but holding far more than its share of the sessions does
        placement.remember(f"other{k}", home.name)
    moved = placement.pick("s", insts)
    assert moved is not home and placement.moves == 1
    others = [i for i in insts if i is not moved]  # its instance left rotation
    assert placement.pick("s", others) is not moved and placement.moves == 2
    assert sum(placement.sessions_on(i.name) for i in insts) == 11


# -- fleet over fake SGLang servers ----------------------------------------------------------


def test_sessions_stick_and_failed_calls_go_elsewhere(fakes: list[FakeServer]) -> None:
    async def go() -> None:
        fleet = make_fleet(fakes, heartbeat_misses=3)
        await fleet.start()
        try:
            homes = {}
            for s in range(12):
                for turn in range(3):
                    r = await fleet.generate(req(f"s{s}", turn))
                    assert homes.setdefault(f"s{s}", r.instance) == r.instance
            assert len(set(homes.values())) == 3
            # i0 answers 500: the call is retried on another instance, not lost.
            victim = next(s for s, home in homes.items() if home == "i0")
            await arm(fakes[0], 1, 500)
            r = await fleet.generate(req(victim, 9))
            assert r.instance != "i0" and len(r.completion_ids) == 4
            assert fleet.instances["i0"].failures == 1 and fleet.instances["i0"].in_rotation
            # The session now lives on its new instance.
            assert (await fleet.generate(req(victim, 10))).instance == r.instance
        finally:
            await fleet.aclose()

    asyncio.run(go())


def test_errors_in_a_row_drain_an_instance_and_a_probe_brings_it_back(
        fakes: list[FakeServer]) -> None:
    async def go() -> None:
        fleet = make_fleet(fakes[:2], heartbeat_misses=2, retries=1)
        await fleet.start()
        try:
            await arm(fakes[0], 2, 503)
            sessions = [f"s{k}" for k in range(20)]
            for s in sessions:  # every call succeeds, on i1 when i0 fails
                assert len((await fleet.generate(req(s))).completion_ids) == 4
            i0 = fleet.instances["i0"]
            assert i0.failures == 2
            # It was drained after two failures, and /health answering puts it back.
            assert i0.removed_at_beat is not None
            await wait_until(lambda: i0.in_rotation, "i0 back in rotation")
            # ... after two good beats in a row, not at the very next one (no flapping).
            assert i0.added_at_beat is not None and i0.added_at_beat >= i0.removed_at_beat + 1
        finally:
            await fleet.aclose()

    asyncio.run(go())


def test_dead_instance_leaves_rotation_and_calls_still_succeed(fakes: list[FakeServer]) -> None:
    async def go() -> None:
        fleet = make_fleet(fakes, heartbeat_misses=2)
        await fleet.start()
        try:
            fakes[2].close()  # the process is gone: connections are refused
            results = [await fleet.generate(req(f"s{k}")) for k in range(30)]
            assert all(r.instance in ("i0", "i1") for r in results)
            assert not fleet.instances["i2"].in_rotation
            assert "connection" in fleet.instances["i2"].reason or \
                "heartbeat" in fleet.instances["i2"].reason
        finally:
            await fleet.aclose()

    asyncio.run(go())


def test_first_call_starts_the_heartbeats(fakes: list[FakeServer]) -> None:
    async def go() -> None:
        fleet = make_fleet(fakes[:2])  # no start(): e.g. an app served without lifespan
        try:
            results = await asyncio.gather(*(fleet.generate(req(f"s{k}")) for k in range(6)))
            assert {r.instance for r in results} == {"i0", "i1"}
            assert fleet.beats >= 1
        finally:
            await fleet.aclose()

    asyncio.run(go())


def test_heartbeats_alone_drain_a_dead_instance_and_readmit_it(
        fakes: list[FakeServer]) -> None:
    """No calls at all: missed beats take it out, a restarted server is taken back."""
    async def go() -> None:
        fleet = make_fleet(fakes[:2], heartbeat_misses=2)
        await fleet.start()
        try:
            i1 = fleet.instances["i1"]
            port = int(fakes[1].url.rsplit(":", 1)[1])
            await asyncio.to_thread(fakes[1].close)
            closed_at = fleet.beats
            await wait_until(lambda: not i1.in_rotation, "i1 out of rotation")
            assert "missed 2 heartbeat" in i1.reason and i1.calls == 0
            assert i1.removed_at_beat is not None and i1.removed_at_beat - closed_at <= 2
            fakes[1] = await asyncio.to_thread(
                serve_in_thread, sglang_app(FakeSGLang(length=4)), "127.0.0.1", port)
            await wait_until(lambda: i1.in_rotation, "i1 back in rotation")
            results = await asyncio.gather(*(fleet.generate(req(f"n{k}")) for k in range(6)))
            assert "i1" in {r.instance for r in results}
        finally:
            await fleet.aclose()

    asyncio.run(go())


async def slow_health(server: FakeServer, delay: float) -> None:
    """`server`'s /health answers after `delay` s (an overloaded engine)."""
    async with httpx.AsyncClient() as http:
        await http.post(f"{server.url}/fake/slow_health", json={"delay": delay})


def test_late_heartbeats_never_take_out_the_last_instance(fakes: list[FakeServer]) -> None:
    """Overload: every engine answers /health late. One stays in rotation and calls succeed;
    when that one then dies for real (connection refused) it goes out all the same."""
    async def go() -> None:
        fleet = make_fleet(fakes[:2], heartbeat_timeout=0.2, heartbeat_misses=2)
        await fleet.start()
        try:
            await wait_until(lambda: all(i.in_rotation for i in fleet.instances.values()),
                             "both in rotation")
            for f in fakes[:2]:
                await slow_health(f, 5.0)
            beats = fleet.beats
            await wait_until(lambda: fleet.beats >= beats + 4, "four late heartbeats")
            kept = [i for i in fleet.instances.values() if i.in_rotation]
            assert len(kept) == 1 and "kept in rotation as the last instance" in kept[0].reason
            assert kept[0].misses >= 2  # late all along, yet never taken out
            results = [await fleet.generate(req(f"s{k}")) for k in range(6)]
            assert {r.instance for r in results} == {kept[0].name}
            # the last instance dies: connection refused is a failure, not lateness
            await asyncio.to_thread(fakes[int(kept[0].name[1:])].close)
            await wait_until(lambda: not kept[0].in_rotation, "the dead instance out")
            assert "missed" in kept[0].reason
            with pytest.raises(BackendUnavailable, match="no engine instance is in rotation"):
                await fleet.generate(req("after"))
        finally:
            await fleet.aclose()

    asyncio.run(go())


def test_attempts_are_bounded_and_bad_requests_are_not_retried(
        fakes: list[FakeServer]) -> None:
    async def go() -> None:
        fleet = make_fleet(fakes, retries=2, heartbeat_misses=5)
        await fleet.start()
        try:
            for f in fakes:
                await arm(f, 5, 502)
            with pytest.raises(BackendUnavailable, match="502"):
                await fleet.generate(req("s"))
            assert sum(len(fake_of(f).received) for f in fakes) == 3  # one per instance
            for f in fakes:
                await arm(f, 0, 500)
            home = (await fleet.generate(req("t"))).instance
            home_fake = fakes[int(home[1:])]
            await arm(home_fake, 1, 400)
            before = sum(len(fake_of(f).received) for f in fakes)
            with pytest.raises(BadRequest):
                await fleet.generate(req("t", 1))
            assert sum(len(fake_of(f).received) for f in fakes) == before + 1
        finally:
            await fleet.aclose()

    asyncio.run(go())


def test_no_instance_in_rotation_is_a_clear_503(fakes: list[FakeServer]) -> None:
    async def go() -> None:
        fleet = make_fleet(fakes[:1], retries=0)
        await fleet.start()
        try:
            fleet.instances["i0"].take_out("test", 0)
            with pytest.raises(BackendUnavailable, match="no engine instance is in rotation"):
                await fleet.generate(req("s"))
        finally:
            await fleet.aclose()

    asyncio.run(go())


def test_pause_holds_calls_and_resume_releases_them(fakes: list[FakeServer]) -> None:
    async def go() -> None:
        fleet = make_fleet(fakes[:2])
        await fleet.start()
        try:
            fleet.pause()
            calls = [asyncio.create_task(fleet.generate(req(f"s{k}"))) for k in range(5)]
            await wait_until(lambda: fleet.gate.waiting == 5, "5 calls waiting at the gate")
            assert not any(c.done() for c in calls) and fleet.in_flight == 0
            fleet.resume()
            assert all(len(r.completion_ids) == 4 for r in await asyncio.gather(*calls))
        finally:
            await fleet.aclose()

    asyncio.run(go())


def test_weight_update_stamps_versions_and_resyncs_a_recovered_instance(
        fakes: list[FakeServer], tmp_path: Path) -> None:
    async def go() -> None:
        fleet = make_fleet(fakes)
        await fleet.start()
        try:
            assert (await fleet.generate(req("s"))).weight_version == 0
            fleet.instances["i2"].take_out("maintenance", fleet.beats)
            outcome = await fleet.update_weights(str(tmp_path), 3)
            assert outcome["updated"] == ["i0", "i1"] and outcome["weight_version"] == 3
            assert {(await fleet.generate(req(f"s{k}"))).weight_version for k in range(6)} == {3}
            # i2 missed the update: the heartbeat loads v3 into it before it rejoins.
            i2 = fleet.instances["i2"]
            await wait_until(lambda: i2.in_rotation, "i2 re-synced and back")
            assert fake_of(fakes[2]).weight_version == "3" and i2.weight_version == 3
            with pytest.raises(BadRequest, match="does not exist"):
                await fleet.update_weights(str(tmp_path / "missing"))
            assert fleet.weight_version == 3 and not fleet.gate.paused
        finally:
            await fleet.aclose()

    asyncio.run(go())


def test_version_of_weights_pushed_out_of_band(fakes: list[FakeServer]) -> None:
    """vLLM-style: weights arrive by other means; the fleet only records the new version."""
    async def go() -> None:
        fleet = make_fleet(fakes[:2])
        await fleet.start()
        try:
            with pytest.raises(BadRequest, match="path"):
                await fleet.update_weights(None)
            outcome = await fleet.update_weights(None, 4)
            assert outcome["updated"] == ["i0", "i1"] and fleet.weight_version == 4
            # The fake reports "default" (no number): the recorded version is stamped.
            assert {(await fleet.generate(req(f"s{k}"))).weight_version for k in range(4)} == {4}
            beats = fleet.beats  # a few heartbeats later nobody is re-synced or drained
            await wait_until(lambda: fleet.beats >= beats + 3, "three more heartbeats")
            assert all(i.in_rotation for i in fleet.instances.values())
            assert all(fake_of(f).received and fake_of(f).weight_version == "default"
                       for f in fakes[:2])
        finally:
            await fleet.aclose()

    asyncio.run(go())


# -- through the gateway ---------------------------------------------------------------------


def gateway(tmp_path: Path, servers: list[FakeServer], **kw):
    return run_in_thread(GatewayConfig(
        port=0, db=f"sqlite:///{tmp_path}/pool.db", backend="sglang",
        upstreams=[s.url for s in servers], heartbeat_interval=0.2, **kw))


def test_admin_routes_pause_weights_resume_and_metrics(fakes: list[FakeServer],
                                                        tmp_path: Path) -> None:
    with gateway(tmp_path, fakes, admin_key="adm", pause_wait=0) as gw:
        admin = {"authorization": "Bearer adm"}
        assert httpx.post(f"{gw.url}/admin/pause").status_code == 401
        r = httpx.post(f"{gw.url}/admin/pause", headers=admin, json={"drain": True})
        assert r.status_code == 200 and r.json()["paused"] and r.json()["drained"]
        key = httpx.post(f"{gw.url}/sessions", headers=admin, json={}).json()["api_key"]
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.RateLimitError) as err:  # pause_wait=0: 429 at once
            client.chat.completions.create(model="default",
                                           messages=[{"role": "user", "content": "hi"}])
        assert err.value.response.headers["retry-after"] == "1"
        assert httpx.post(f"{gw.url}/admin/resume", headers=admin).json()["paused"] is False
        r = httpx.post(f"{gw.url}/admin/weights", headers=admin,
                       json={"path": str(tmp_path), "version": 5})
        assert r.status_code == 200 and r.json()["weight_version"] == 5, r.text
        client.chat.completions.create(model="default",
                                       messages=[{"role": "user", "content": "hi"}])
        bad = httpx.post(f"{gw.url}/admin/weights", headers=admin, json={"path": 3})
        assert bad.status_code == 400 and "path" in bad.json()["error"]["message"]
        state = httpx.get(f"{gw.url}/admin/fleet", headers=admin).json()
        assert state["weight_version"] == 5 and len(state["instances"]) == 3
        metrics = httpx.get(f"{gw.url}/metrics").text
        for name in ("envhub_fleet_instance_up", "envhub_fleet_in_flight",
                     "envhub_fleet_call_ms_bucket", "envhub_fleet_calls_total",
                     "envhub_fleet_tokens_per_second", "envhub_fleet_waiting"):
            assert f"{name}{{" in metrics or f"{name} " in metrics, name
        ok = [line for line in metrics.splitlines()
              if line.startswith("envhub_fleet_calls_total") and 'outcome="ok"' in line]
        assert sum(float(line.rsplit(" ", 1)[1]) for line in ok) == 1.0


def test_pause_without_a_fleet_is_a_clear_400(tmp_path: Path) -> None:
    from envhub.gateway.backends.zero import ZeroBackend

    with run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{tmp_path}/p.db"),
                       backend=ZeroBackend()) as gw:
        r = httpx.post(f"{gw.url}/admin/pause")
        assert r.status_code == 400 and "fleet" in r.json()["error"]["message"]
        # The zero backend can still take a weight update (it just bumps its version).
        r = httpx.post(f"{gw.url}/admin/weights", json={"path": str(tmp_path)})
        assert r.status_code == 200 and r.json()["weight_version"] == 1
