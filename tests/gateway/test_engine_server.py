"""`envhub engine` as a real child process: vLLM's token API shapes (openai client and raw
HTTP), SGLang's weight endpoints, the debug record, batching, and 4xx on bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from envhub.gateway.engine.process import EngineProcess

pytest.importorskip("torch")

PROMPT = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with EngineProcess(["--threads", "1", "--max-batch-size", "8"], log_path=log) as proc:
        yield proc


def post(server: EngineProcess, body: Any, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def test_openai_client_token_prompt(server: EngineProcess) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    # the module's engine is shared: test_update_weights_from_disk, run before this in another
    # order (--shuffle), moves its version on
    version = httpx.get(server.url + "/get_weight_version", timeout=60).json()["weight_version"]
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                    logprobs=2, extra_body={"return_token_ids": True})
    choice = out.choices[0]
    extra = choice.model_extra or {}
    assert extra["prompt_token_ids"] == PROMPT
    ids = extra["token_ids"]
    assert len(ids) == 8 and choice.finish_reason == "length"
    assert choice.logprobs is not None and len(choice.logprobs.token_logprobs) == 8
    assert all(len(top) >= 1 for top in choice.logprobs.top_logprobs)
    assert (out.model_extra or {})["weight_version"] == version
    assert out.usage is not None and out.usage.prompt_tokens == len(PROMPT)
    assert out.usage.completion_tokens == 8
    tok = client.models.list().data[0]
    assert tok.id == "tiny"


def test_raw_http_shapes_many_prompts_and_n(server: EngineProcess) -> None:
    # 32 tokens: the fine-tuned model opens every answer with the same `<tool_call>` lead-in,
    # so two seeds differ only once the digits come
    body = {"prompt": [PROMPT, PROMPT[:5]], "n": 2, "max_tokens": 32, "temperature": 1.0,
            "seed": 11, "logprobs": 1, "return_token_ids": True,
            "return_tokens_as_token_ids": True, "add_special_tokens": False}
    first, again = post(server, body).json(), post(server, body).json()
    assert [c["index"] for c in first["choices"]] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in first["choices"]] == [PROMPT, PROMPT, PROMPT[:5],
                                                                  PROMPT[:5]]
    assert first["choices"][0]["token_ids"] != first["choices"][1]["token_ids"]  # seed, seed+1
    assert [c["token_ids"] for c in first["choices"]] == [c["token_ids"] for c in again["choices"]]
    c = first["choices"][0]
    assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
    assert all(f"token_id:{t}" in top for t, top in zip(c["token_ids"],
                                                        c["logprobs"]["top_logprobs"], strict=True))
    sampled = sum(len(c["token_ids"]) for c in first["choices"])
    assert 4 <= sampled <= 4 * 32
    assert first["usage"] == {"prompt_tokens": len(PROMPT) + 5, "completion_tokens": sampled,
                              "total_tokens": len(PROMPT) + 5 + sampled}
    plain = post(server, {"prompt": PROMPT, "max_tokens": 3}).json()["choices"][0]
    assert "token_ids" not in plain and plain["logprobs"] is None


def test_stop_string_text_is_cut_but_ids_are_kept(server: EngineProcess) -> None:
    greedy = post(server, {"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                           "return_token_ids": True}).json()["choices"][0]
    text = greedy["text"]
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop.strip()
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stop": stop,
            "return_token_ids": True}
    cut = post(server, body).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["text"] == text[:text.find(stop)]
    assert greedy["token_ids"][:len(cut["token_ids"])] == cut["token_ids"]
    kept = post(server, {**body, "include_stop_str_in_output": True}).json()["choices"][0]
    assert kept["text"].endswith(stop) or stop in kept["text"]


def test_debug_requests_record_exact_prompt_ids(server: EngineProcess) -> None:
    odd = [151657, 198, 90, 1, 2, 3, 151658]  # non-special added tokens survive as ids
    assert post(server, {"prompt": odd, "max_tokens": 1, "request_id": "probe-1"}
                ).status_code == 200
    got = httpx.get(server.url + "/debug/requests",
                    params={"request_id": "probe-1"}).json()["requests"]
    assert [r["prompt_token_ids"] for r in got] == [odd]
    recent = httpx.get(server.url + "/debug/requests", params={"limit": 1}).json()["requests"]
    assert len(recent) == 1 and recent[0]["request_id"] == "probe-1"


def test_concurrent_http_requests_are_batched(server: EngineProcess) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json={
                "prompt": PROMPT[:3 + i], "max_tokens": 24, "temperature": 0})
                for i in range(6)))

    assert all(r.status_code == 200 for r in asyncio.run(burst()))
    stats = httpx.get(server.url + "/stats").json()
    assert stats["max_batch_size"] > 1, stats


BAD_BODIES: list[tuple[Any, str]] = [
    (b'{"prompt": [1, 2', "malformed JSON"),
    ({"prompt": [10 ** 6]}, "outside the vocabulary"),
    ({"prompt": [-3]}, "outside the vocabulary"),
    ({"prompt": [[1, 2], [151665]]}, "outside the vocabulary"),
    ({"prompt": [1], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1], "max_tokens": 10 ** 6}, "maximum context length"),
    ({"prompt": [1.5]}, "prompt"),
    ({"prompt": [True]}, "prompt"),
    ({"prompt": []}, "prompt is empty"),
    ({"max_tokens": 3}, "prompt"),
    ([1, 2, 3], "body"),
    ({"prompt": [1], "temperature": -1}, "temperature"),
    ({"prompt": [1], "top_p": 0}, "top_p"),
    ({"prompt": [1], "logprobs": 50}, "logprobs"),
    ({"prompt": [1], "stream": True}, "stream"),
]


@pytest.mark.parametrize("body,expect", BAD_BODIES)
def test_bad_input_is_a_4xx_and_serving_goes_on(server: EngineProcess, body: Any,
                                                  expect: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + "/v1/completions", content=content,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert expect in error["message"] and error["type"] == "invalid_request_error"
    assert post(server, {"prompt": [1, 2], "max_tokens": 1}).status_code == 200


def test_update_weights_from_disk(server: EngineProcess, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    from envhub.gateway.engine import BUNDLED_MODEL

    base = post(server, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                         "return_token_ids": True}).json()
    state = load_file(str(BUNDLED_MODEL / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    shifted = {k: (v.float() + 0.5 * torch.randn(v.shape, generator=gen)).to(v.dtype)
               for k, v in state.items()}
    save_file(shifted, str(tmp_path / "model.safetensors"))
    before = httpx.get(server.url + "/get_weight_version").json()["weight_version"]

    r = post(server, {"model_path": str(tmp_path)}, "/update_weights_from_disk")
    assert r.status_code == 200 and r.json()["success"] is True
    assert r.json()["weight_version"] == before + 1
    assert httpx.get(server.url + "/get_weight_version").json() == {"weight_version": before + 1}
    new = post(server, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                        "return_token_ids": True}).json()
    assert new["weight_version"] == before + 1
    assert new["choices"][0]["token_ids"] != base["choices"][0]["token_ids"]

    bad = post(server, {"model_path": str(tmp_path / "nope")}, "/update_weights_from_disk")
    assert bad.status_code == 400 and bad.json()["success"] is False
    assert "model_path" == bad.json()["error"]["param"]

    r = post(server, {"model_path": str(BUNDLED_MODEL), "weight_version": "40"},
             "/update_weights_from_disk")
    assert r.json()["weight_version"] == 40
    info = httpx.get(server.url + "/model_info").json()
    assert info["weight_version"] == 40
    back = post(server, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                         "return_token_ids": True}).json()
    assert back["choices"][0]["token_ids"] == base["choices"][0]["token_ids"]


def test_zero_mode_serves_the_same_shapes(tmp_path: Path) -> None:
    with EngineProcess(["--zero", "--zero-length", "5"], log_path=tmp_path / "zero.log") as z:
        full = post(z, {"prompt": PROMPT, "max_tokens": 16, "logprobs": 0,
                        "return_token_ids": True}).json()
        choice = full["choices"][0]
        assert choice["token_ids"] == [5394] * 4 + [151645]
        assert choice["text"] == " ok ok ok ok" and choice["finish_reason"] == "stop"
        assert choice["logprobs"]["token_logprobs"] == [-0.25] * 4 + [-0.05]
        cut = post(z, {"prompt": PROMPT, "max_tokens": 2, "return_token_ids": True}).json()
        assert cut["choices"][0]["token_ids"] == [5394] * 2
        assert cut["choices"][0]["finish_reason"] == "length"
        assert post(z, {"prompt": [10 ** 7]}).status_code == 400
        assert httpx.get(z.url + "/v1/models").json()["data"][0]["id"] == "zero"


def test_cli_rejects_a_missing_model_folder(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "envhub", "engine", "--model",
                          str(tmp_path / "nope"), "--port", "1"], check=False,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "--model PATH" in out.stderr


def test_structured_outputs_in_vllm_shape(server: EngineProcess) -> None:
    """vLLM's `structured_outputs` field (what the vllm backend sends): JSON schema and Lark."""
    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    r = post(server, {"prompt": PROMPT, "max_tokens": 20, "seed": 1,
                      "structured_outputs": {"json": schema}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and set(json.loads(choice["text"])) == {"n"}
    r = post(server, {"prompt": PROMPT, "max_tokens": 8, "seed": 1,
                      "structured_outputs": {"grammar": 'start: "yes" | "no"'}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("yes", "no")
    for bad in ({"regex": "a+"}, {"json": "not json"}, {"grammar": "start: ((("},
                {"json": {"type": "objekt"}}):
        r = post(server, {"prompt": PROMPT, "max_tokens": 4, "structured_outputs": bad})
        assert r.status_code == 400, (bad, r.text)
