"""VLLMBackend against real `envhub engine` processes (the model and the zero engine), and
against vLLM's documented response shape for servers older than `return_token_ids`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envhub.gateway.backends.base import Backend, GenerateRequest, SamplingParams
from envhub.gateway.backends.vllm import VLLMBackend
from envhub.gateway.engine import BUNDLED_MODEL
from envhub.gateway.engine.process import EngineProcess
from envhub.gateway.errors import BackendUnavailable, BadRequest
from tests.support import free_port

PROMPT = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def call(url: str, request: GenerateRequest, **kw: Any) -> Any:
    backend = VLLMBackend(url, **kw)
    try:
        return await backend.generate(request)
    finally:
        await backend.aclose()


def req(prompt: list[int] = PROMPT, **params: Any) -> GenerateRequest:
    return GenerateRequest(prompt_ids=list(prompt), params=SamplingParams(**params),
                           request_id="r-1")


@pytest.fixture(scope="module")
def zero(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    log = tmp_path_factory.mktemp("zero") / "engine.log"
    with EngineProcess(["--zero", "--zero-length", "6", "--weight-version", "4"],
                       log_path=log) as proc:
        yield proc


def test_is_a_backend(zero: EngineProcess) -> None:
    async def check() -> dict[str, Any]:
        backend = VLLMBackend(zero.url)  # one pooled client, used within one event loop
        assert isinstance(backend, Backend)
        try:
            return await backend.health()
        finally:
            await backend.aclose()

    health = run(check())
    assert health["status"] == "ok" and health["weight_version"] == 4


CLIENTS = pytest.mark.parametrize("client", ["aiohttp", "httpx"])


@CLIENTS
def test_generate_on_the_zero_engine(zero: EngineProcess, client: str) -> None:
    r = run(call(zero.url, req(max_tokens=32, top_logprobs=2, stop_token_ids=[7]),
                 client=client))
    assert r.completion_ids == [5394] * 5 + [151645]
    assert r.logprobs == [-0.25] * 5 + [-0.05]
    assert r.finish_reason == "stop" and r.weight_version == 4
    assert r.prompt_ids_seen == PROMPT and r.instance == zero.url
    assert r.top_logprobs is not None and r.top_logprobs[0][0] == (5394, -0.25)
    short = run(call(zero.url, req(max_tokens=2), client=client))
    assert short.completion_ids == [5394, 5394] and short.finish_reason == "length"


@CLIENTS
def test_errors_map_onto_gateway_errors(zero: EngineProcess, client: str) -> None:
    with pytest.raises(BadRequest, match="outside the vocabulary"):
        run(call(zero.url, req([10 ** 7]), client=client))
    with pytest.raises(BackendUnavailable, match="unreachable"):
        run(call(f"http://127.0.0.1:{free_port()}", req(), client=client))
    with pytest.raises(BackendUnavailable, match="HTTP 404"):  # a server without the token API
        run(call(zero.url + "/not-an-engine", req(), client=client))
    with pytest.raises(ValueError, match="unknown HTTP client"):
        VLLMBackend(zero.url, client="curl")
    with pytest.raises(BackendUnavailable, match="unexpected completions shape"):
        VLLMBackend(zero.url, client="aiohttp").parse({"choices": []})


def test_old_vllm_shape_without_token_ids() -> None:
    """vLLM < 0.10.2 has no `token_ids`; ids come back from `token_id:N` logprob labels."""
    backend = VLLMBackend("http://127.0.0.1:9", weight_version=2, client="aiohttp")
    data = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [{
        "index": 0, "text": "Hi", "finish_reason": "stop", "stop_reason": None,
        "logprobs": {"tokens": ["token_id:13048", "token_id:151645"],
                     "token_logprobs": [-0.5, -0.1], "text_offset": [0, 2],
                     "top_logprobs": [{"token_id:13048": -0.5, "token_id:9": -1.5},
                                      {"token_id:151645": -0.1}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    r = backend.parse(data)
    assert r.completion_ids == [13048, 151645] and r.logprobs == [-0.5, -0.1]
    assert r.weight_version == 2 and r.prompt_ids_seen is None
    assert r.top_logprobs == [[(13048, -0.5), (9, -1.5)], [(151645, -0.1)]]
    run(backend.aclose())


def test_matches_the_in_process_engine_and_updates_weights(tmp_path: Path) -> None:
    """Same model over HTTP and in process: identical greedy ids; weights go through HTTP."""
    pytest.importorskip("torch")
    from envhub.gateway.engine import Engine, EngineConfig

    local = Engine(EngineConfig(threads=1))
    try:
        expected = run(local.generate(req(max_tokens=10, temperature=0)))
    finally:
        local.close()
    with EngineProcess(["--threads", "1"], log_path=tmp_path / "engine.log") as proc:
        async def scenario() -> tuple[Any, int, Any]:
            backend = VLLMBackend(proc.url, model="tiny")
            try:
                got = await backend.generate(req(max_tokens=10, temperature=0))
                version = await backend.load_weights(str(BUNDLED_MODEL), version=9)
                after = await backend.generate(req(max_tokens=2, temperature=0))
                return got, version, after
            finally:
                await backend.aclose()

        got, version, after = run(scenario())
    assert got.completion_ids == expected.completion_ids
    assert max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs, strict=True)) < 1e-3
    assert version == 9 and after.weight_version == 9


def test_engine_serves_vllms_rl_routes(zero: EngineProcess, tmp_path: Path) -> None:
    """envhub engine answers vLLM 0.32's RL routes as vLLM does (paths, bodies, answers); a
    paused engine holds new completions until /resume."""
    import httpx

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=zero.url, timeout=30) as http:
            body = {"prompt": PROMPT, "max_tokens": 2, "logprobs": 0, "return_token_ids": True}
            assert (await http.post("/pause?mode=wait")).json() == {"status": "paused"}
            assert (await http.get("/is_paused")).json() == {"is_paused": True}
            held = asyncio.ensure_future(http.post("/v1/completions", json=body))
            for _ in range(300):  # it reached the engine and waits at the gate
                if (await http.get("/stats")).json()["requests_held"] == 1:
                    break
                await asyncio.sleep(0.02)
            assert (await http.get("/stats")).json()["requests_held"] == 1
            assert "envhub_engine_requests_held 1.0" in (await http.get("/metrics")).text
            assert not held.done()
            assert (await http.post("/resume")).json() == {"status": "resumed"}
            assert (await held).status_code == 200
            assert (await http.get("/stats")).json()["requests_held"] == 0
            bad = await http.post("/pause?mode=abort")
            assert bad.status_code == 400 and "mode=wait" in bad.json()["error"]["message"]
            rpc = await http.post("/collective_rpc", json={"method": "sleep"})
            assert rpc.status_code == 400 and "reload_weights" in rpc.json()["error"]["message"]
            ok = await http.post("/collective_rpc", json={
                "method": "reload_weights", "kwargs": {"weights_path": str(tmp_path)}})
            assert ok.json() == {"results": [None]}
            assert (await http.get("/weight_info")).json() == {"weight_version": "4"}
            v = await http.post("/update_weight_version", json={"new_version": "7"})
            assert v.json() == {"success": True, "new_version": "7"}
            assert (await http.get("/weight_info")).json() == {"weight_version": "7"}
            bad_v = await http.post("/update_weight_version", json={"new_version": "v8"})
            assert bad_v.status_code == 400
            assert (await http.post("/update_weight_version", json={"new_version": "4"})
                    ).status_code == 200

    run(scenario())
