"""Real `envhub engine` processes behind one gateway, driven by the official AsyncOpenAI client:
sticky sessions, `kill -9` of an engine mid-run with no failed call and no lost or duplicated
turn, restart and re-admission, and weight updates under load (zero-work engines for the big
concurrency runs, the bundled tiny model for a real weight swap)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from envhub.gateway.config import GatewayConfig
from envhub.gateway.engine.process import EngineProcess
from envhub.gateway.router import Fleet
from envhub.gateway.server import GatewayHandle, run_in_thread

pytestmark = pytest.mark.slow

HEARTBEAT = 0.5
# Healthy engines answering 200 sessions on a loaded 2-core box can miss one or two beats (seen:
# a CI run beside three training jobs took every engine out of rotation at 2 misses).
HEARTBEAT_MISSES = 4
ZERO = ["--zero", "--zero-length", "4"]


def start_engines(args: list[str], n: int, tmp_path: Path) -> list[EngineProcess]:
    procs = [EngineProcess(args, log_path=tmp_path / f"engine{k}.log") for k in range(n)]
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda p: p.start(), procs))
    return procs


@pytest.fixture
def zero_engines(tmp_path: Path) -> Iterator[list[EngineProcess]]:
    procs = start_engines(ZERO, 3, tmp_path)
    yield procs
    for p in procs:
        p.stop()


def start_gateway(tmp_path: Path, engines: list[EngineProcess]) -> GatewayHandle:
    return run_in_thread(GatewayConfig(
        port=0, db=f"sqlite:///{tmp_path}/pool.db", backend="vllm",
        upstreams=[e.url for e in engines], heartbeat_interval=HEARTBEAT,
        heartbeat_misses=HEARTBEAT_MISSES,
        default_max_tokens=16))


def fleet_of(gw: GatewayHandle) -> Fleet:
    backend = gw.app.state.gw.backend
    assert isinstance(backend, Fleet)
    return backend


class Agent:
    """One session: a growing chat, every answer remembered with the seq the gateway gave."""

    def __init__(self, gw: GatewayHandle, sid: str, **create: Any):
        self.sid = sid
        self.url = gw.url
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
        self.create = create
        self.answers: list[dict[str, Any]] = []  # {seq, version, tokens}
        self.errors: list[str] = []

    async def turns(self, n: int, done: list[int] | None = None) -> None:
        # A client per phase: each phase runs in its own event loop.
        # No keep-alive: a reused connection can meet uvicorn's 5 s keep-alive timeout at
        # that instant (a transport race, not a gateway failure, which max_retries=0 would
        # report as one). A shorter client expiry is not enough: the gateway runs in this
        # process, and on a loaded machine the client's loop sees a response seconds after
        # the server wrote it, so the server's idle clock runs ahead of the client's.
        http = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_keepalive_connections=0))
        async with openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.sid,
                                      max_retries=0, timeout=120, http_client=http) as client:
            for _ in range(n):
                await self._turn(client, done)

    async def _turn(self, client: openai.AsyncOpenAI, done: list[int] | None) -> None:
        self.messages.append({"role": "user", "content": f"turn {len(self.answers)}"})
        try:
            resp = await client.chat.completions.create(
                model="default", messages=self.messages, **self.create)  # type: ignore
        except openai.OpenAIError as exc:
            self.errors.append(f"{exc!r} caused by {exc.__cause__!r}")
            self.messages.pop()
            return
        ext = resp.model_extra["envhub"]  # type: ignore[index]
        self.answers.append({"seq": ext["seqs"][0], "version": ext["weight_versions"][0],
                             "tokens": resp.usage.completion_tokens})  # type: ignore
        self.messages.append({"role": "assistant",
                              "content": resp.choices[0].message.content or ""})
        if done is not None:
            done[0] += 1

    async def trajectory(self, http: httpx.AsyncClient) -> dict[str, Any]:
        r = await http.get(f"/sessions/{self.sid}/trajectory")
        assert r.status_code == 200, r.text
        return r.json()


async def check_turns(gw: GatewayHandle, agents: list[Agent]) -> dict[str, list[dict]]:
    """Every answered call is exactly one recorded turn (same seqs, same sizes, no extras);
    returns each session's turns."""
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
        trajs = await asyncio.gather(*(a.trajectory(http) for a in agents))
    out = {}
    for agent, traj in zip(agents, trajs, strict=True):
        turns = traj["turns"]
        assert [t["seq"] for t in turns] == [a["seq"] for a in agent.answers], agent.sid
        assert [len(t["completion_ids"]) for t in turns] == [a["tokens"] for a in agent.answers]
        assert [t["weight_version"] for t in turns] == [a["version"] for a in agent.answers]
        out[agent.sid] = turns
    return out


def test_sticky_sessions_and_kill_9_failover(zero_engines: list[EngineProcess],
                                             tmp_path: Path) -> None:
    with start_gateway(tmp_path, zero_engines) as gw:
        fleet = fleet_of(gw)
        urls = [e.url for e in zero_engines]
        agents = [Agent(gw, f"fo-{k}") for k in range(200)]

        async def phase_healthy() -> dict[str, list[dict]]:
            await asyncio.gather(*(a.turns(3) for a in agents))
            return await check_turns(gw, agents)

        turns = asyncio.run(phase_healthy())
        assert not [e for a in agents for e in a.errors]
        on_home = sum(Counter(t["instance"] for t in ts).most_common(1)[0][1]
                      for ts in turns.values())
        assert on_home / sum(len(ts) for ts in turns.values()) >= 0.99
        assert {t["instance"] for ts in turns.values() for t in ts} == set(urls)

        # kill -9 one engine while 200 sessions keep going.
        victim = zero_engines[0]
        killed_at: dict[str, int] = {}

        async def phase_kill() -> None:
            done = [0]

            async def killer() -> None:
                while done[0] < 150:
                    await asyncio.sleep(0.01)
                assert victim.process is not None
                victim.process.kill()  # SIGKILL: no goodbye, connections just drop
                killed_at["beat"] = fleet.beats

            await asyncio.gather(killer(), *(a.turns(4, done) for a in agents))

        asyncio.run(phase_kill())
        errors = [e for a in agents for e in a.errors]
        assert errors == [], errors[:5]
        asyncio.run(check_turns(gw, agents))  # none lost, none twice
        dead = fleet.instances[victim.url]
        assert not dead.in_rotation and dead.removed_at_beat is not None
        assert dead.removed_at_beat - killed_at["beat"] <= HEARTBEAT_MISSES, dead.describe()

        # Restart on the same port: the heartbeat re-admits it and new sessions reach it.
        restarted = EngineProcess(ZERO, port=victim.port, log_path=tmp_path / "restart.log")
        zero_engines[0] = restarted.start()
        deadline = time.monotonic() + 60
        while not dead.in_rotation:
            assert time.monotonic() < deadline, dead.describe()
            time.sleep(0.05)
        late = [Agent(gw, f"late-{k}") for k in range(30)]

        async def phase_back() -> dict[str, list[dict]]:
            await asyncio.gather(*(a.turns(2) for a in late))
            return await check_turns(gw, late)

        back = asyncio.run(phase_back())
        assert not [e for a in late for e in a.errors]
        assert any(t["instance"] == victim.url for ts in back.values() for t in ts)


def test_weight_update_during_100_sessions(zero_engines: list[EngineProcess],
                                           tmp_path: Path) -> None:
    with start_gateway(tmp_path, zero_engines) as gw:
        agents = [Agent(gw, f"wu-{k}") for k in range(100)]
        window: dict[str, float] = {}

        async def run() -> dict[str, Any]:
            done = [0]

            async def update() -> dict[str, Any]:
                while done[0] < 200:
                    await asyncio.sleep(0.01)
                async with httpx.AsyncClient(base_url=gw.url, timeout=120) as http:
                    window["start"] = time.time()
                    r = await http.post("/admin/weights", json={"path": str(tmp_path)})
                    window["end"] = time.time()
                assert r.status_code == 200, r.text
                return r.json()

            outcome, *_ = await asyncio.gather(update(), *(a.turns(6, done) for a in agents))
            return outcome

        outcome = asyncio.run(run())
        assert outcome["weight_version"] == 1 and not outcome["failed"]
        assert len(outcome["updated"]) == 3
        assert not [e for a in agents for e in a.errors]
        turns = asyncio.run(check_turns(gw, agents))
        flat = [t for ts in turns.values() for t in ts]
        assert {t["weight_version"] for t in flat} == {0, 1}
        # Calls drain before the swap: v0 turns were all sampled before it finished, v1 turns
        # only after it began.
        assert all(t["created_at"] <= window["end"] for t in flat if t["weight_version"] == 0)
        assert all(t["created_at"] >= window["start"] for t in flat if t["weight_version"] == 1)
        # Versions never go back inside a session, and some sessions saw the change.
        for ts in turns.values():
            versions = [t["weight_version"] for t in ts]
            assert versions == sorted(versions)
        changed = [sid for sid, ts in turns.items() if {t["weight_version"] for t in ts} == {0, 1}]
        assert changed
        async def traj() -> dict[str, Any]:
            async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
                return await next(a for a in agents if a.sid == changed[0]).trajectory(http)

        segment = asyncio.run(traj())["segments"][0]
        assert {0, 1} <= set(segment["weight_versions"])


def test_real_weights_swap_on_tiny_model_engines(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    from envhub.gateway.engine.config import BUNDLED_MODEL

    state = load_file(str(BUNDLED_MODEL / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    new = {k: (v.float() + 0.5 * torch.randn(v.shape, generator=generator)).to(v.dtype)
           for k, v in state.items()}
    ckpt = tmp_path / "step1"
    ckpt.mkdir()
    save_file(new, str(ckpt / "model.safetensors"))

    engines = start_engines(["--threads", "1", "--max-batch-size", "8"], 2, tmp_path)
    try:
        with start_gateway(tmp_path, engines) as gw:
            greedy = {"temperature": 0, "max_tokens": 6, "logprobs": True}
            probe = {"role": "user", "content": "say something"}

            def ask(key: str) -> Any:
                c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
                return c.chat.completions.create(model="default", messages=[probe], **greedy)

            before = ask("probe-before")
            agents = [Agent(gw, f"tw-{k}", **greedy) for k in range(6)]

            async def run() -> None:
                await asyncio.gather(*(a.turns(2) for a in agents))
                async with httpx.AsyncClient(base_url=gw.url, timeout=300) as http:
                    r = await http.post("/admin/weights", json={"path": str(ckpt),
                                                                "version": 7})
                    assert r.status_code == 200 and not r.json()["failed"], r.text
                await asyncio.gather(*(a.turns(2) for a in agents))

            asyncio.run(run())
            after = ask("probe-after")
            assert before.model_extra["envhub"]["weight_versions"] == [0]  # type: ignore
            assert after.model_extra["envhub"]["weight_versions"] == [7]  # type: ignore
            lp_before = [x.logprob for x in before.choices[0].logprobs.content]  # type: ignore
            lp_after = [x.logprob for x in after.choices[0].logprobs.content]  # type: ignore
            assert lp_before != lp_after  # the engines really sample from the new weights
            assert not [e for a in agents for e in a.errors]
            turns = asyncio.run(check_turns(gw, agents))
            for ts in turns.values():
                assert [t["weight_version"] for t in ts] == [0, 0, 7, 7]
    finally:
        for e in engines:
            e.stop()


def test_restarted_engine_is_reloaded_before_it_serves_again(tmp_path: Path) -> None:
    """An engine restarted after a weight push comes back with its start-up weights. Its /health
    says nothing of versions (vLLM's shape), so the heartbeat asks /weight_info, keeps it out
    of rotation and re-pushes the fleet's weights: every sample after that is the new version."""
    args = [*ZERO, "--no-health-version"]
    engines = start_engines(args, 2, tmp_path)
    try:
        with start_gateway(tmp_path, engines) as gw:
            fleet = fleet_of(gw)
            r = httpx.post(f"{gw.url}/admin/weights", json={"path": str(tmp_path), "version": 3},
                           timeout=120)
            assert r.status_code == 200 and not r.json()["failed"], r.text
            victim = engines[0]
            inst = fleet.instances[victim.url]
            victim.stop()
            engines[0] = EngineProcess(args, port=victim.port,
                                       log_path=tmp_path / "restart.log").start()
            deadline = time.monotonic() + 60
            while not (inst.in_rotation and inst.weight_version == 3):
                assert time.monotonic() < deadline, inst.describe()
                time.sleep(0.05)
            # the gateway re-pushed v3: nothing else told the restarted engine about it
            info = httpx.get(f"{victim.url}/weight_info").json()
            assert info["weight_version"] == "3", info
            calls_before = inst.calls
            for k in range(12):
                c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"rs-{k}", max_retries=0)
                answer = c.chat.completions.create(
                    model="default", messages=[{"role": "user", "content": "hi"}])
                assert answer.model_extra["envhub"]["weight_versions"] == [3]  # type: ignore
            assert inst.calls > calls_before  # the restarted engine served some of them
    finally:
        for e in engines:
            e.stop()
