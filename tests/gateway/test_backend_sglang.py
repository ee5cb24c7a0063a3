"""The sglang backend against the fake SGLang server (SGLang's documented native API), and a
gateway with an SGLang upstream driven by the official openai client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from envhub.gateway.backends.base import GenerateRequest, SamplingParams
from envhub.gateway.backends.sglang import SGLangBackend
from envhub.gateway.config import GatewayConfig
from envhub.gateway.engine.zero import EOS_LOGPROB, FILLER_LOGPROB, QWEN_IM_END, QWEN_OK
from envhub.gateway.errors import BackendUnavailable, BadRequest, Overloaded
from envhub.gateway.fakes import FakeServer, serve_in_thread
from envhub.gateway.fakes.sglang import FakeSGLang, sglang_app
from envhub.gateway.server import run_in_thread

PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = serve_in_thread(sglang_app(FakeSGLang(length=6)))
    yield server
    server.close()


def req(**params) -> GenerateRequest:
    return GenerateRequest(PROMPT, SamplingParams(**params), request_id="s1-0", session_id="s1")


async def with_backend(url: str, fn):
    backend = SGLangBackend(url, instance="sg-1")
    try:
        return await fn(backend)
    finally:
        await backend.aclose()


def test_generate_sends_sglang_shape_and_parses_ids(fake: FakeServer) -> None:
    result = asyncio.run(with_backend(fake.url, lambda b: b.generate(
        req(max_tokens=32, temperature=0.5, top_p=0.9, stop=["\n\n"], stop_token_ids=[7]))))
    assert result.completion_ids == [QWEN_OK] * 5 + [QWEN_IM_END]
    assert result.logprobs == [FILLER_LOGPROB] * 5 + [EOS_LOGPROB]
    assert result.finish_reason == "stop" and result.instance == "sg-1"
    assert result.weight_version == 0  # SGLang says "default": keep the known version
    body = fake.app.state.fake.received[-1]
    assert body["input_ids"] == PROMPT and body["return_logprob"] is True
    assert body["rid"].startswith("s1-0-")
    assert body["sampling_params"] == {
        "max_new_tokens": 32, "temperature": 0.5, "top_p": 0.9, "stop": ["\n\n"],
        "stop_token_ids": [7], "skip_special_tokens": False, "no_stop_trim": True,
        "spaces_between_special_tokens": False}


def test_length_finish_and_top_logprobs(fake: FakeServer) -> None:
    result = asyncio.run(with_backend(fake.url, lambda b: b.generate(
        req(max_tokens=3, top_logprobs=2))))
    assert result.finish_reason == "length" and len(result.completion_ids) == 3
    assert result.top_logprobs is not None
    assert [row[0][0] for row in result.top_logprobs] == result.completion_ids


def test_weight_update_and_version_in_meta_info(fake: FakeServer, tmp_path: Path) -> None:
    async def go(b: SGLangBackend):
        assert await b.load_weights(str(tmp_path), 7) == 7
        info = await b.health()
        return info, await b.generate(req())

    info, result = asyncio.run(with_backend(fake.url, go))
    assert info["weight_version"] == 7 and result.weight_version == 7
    assert fake.app.state.fake.weight_version == "7"


def test_weight_update_bad_path_is_a_bad_request(fake: FakeServer, tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="does not exist"):
        asyncio.run(with_backend(fake.url, lambda b: b.load_weights(str(tmp_path / "nope"), 1)))


@pytest.mark.parametrize("status,error", [(500, BackendUnavailable), (503, BackendUnavailable),
                                          (429, Overloaded), (400, BadRequest)])
def test_errors_map_to_gateway_errors(fake: FakeServer, status: int, error: type) -> None:
    httpx.post(f"{fake.url}/fake/fail", json={"count": 1, "status": status})
    with pytest.raises(error):
        asyncio.run(with_backend(fake.url, lambda b: b.generate(req())))


def test_unreachable_server_is_unavailable() -> None:
    with pytest.raises(BackendUnavailable, match="unreachable"):
        asyncio.run(with_backend("http://127.0.0.1:9", lambda b: b.generate(req())))


def test_cancelled_call_aborts_the_request_on_the_server() -> None:
    """The agent hung up: the engine is told to drop the request (frees its KV cache)."""
    fake = FakeSGLang(length=8, token_delay=5.0)
    with serve_in_thread(sglang_app(fake)) as server:
        async def go(b: SGLangBackend) -> None:
            task = asyncio.create_task(b.generate(req()))
            deadline = time.monotonic() + 30
            while not fake.received and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(with_backend(server.url, go))  # aclose waits for the abort call
        rid = fake.received[0]["rid"]
        assert fake.aborted == [rid]


def test_gateway_with_sglang_upstream(fake: FakeServer, tmp_path: Path) -> None:
    config = GatewayConfig(port=0, db=f"sqlite:///{tmp_path}/pool.db", backend="sglang",
                           upstreams=[fake.url], heartbeat_interval=0.5)
    with run_in_thread(config) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sg-run", max_retries=0)
        resp = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], logprobs=True)
        assert resp.choices[0].message.content == " ok ok ok ok ok"
        traj = httpx.get(f"{gw.url}/sessions/sg-run/trajectory").json()
        turn = traj["turns"][0]
        assert turn["instance"] == fake.url
        assert turn["completion_ids"] == [QWEN_OK] * 5 + [QWEN_IM_END]
        # The pool stores float32 logprobs.
        assert turn["completion_logprobs"] == pytest.approx(
            [x.logprob for x in resp.choices[0].logprobs.content], rel=1e-6)
        # The prompt the engine received is exactly the recorded prompt.
        assert fake.app.state.fake.received[-1]["input_ids"] == turn["prompt_ids"]
