"""Hosted models through LiteLLM, pointed (api_base) at the in-repo OpenAI-shaped server:
text in / text out, turns recorded as text and marked not trainable. No network."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

pytest.importorskip("litellm")

from envhub.gateway.backends.base import GenerateRequest, SamplingParams
from envhub.gateway.backends.litellm import LiteLLMBackend, messages_from_chatml
from envhub.gateway.config import BUNDLED_MODEL, GatewayConfig
from envhub.gateway.errors import BackendUnavailable, BadRequest, Overloaded
from envhub.gateway.fakes import FakeServer, serve_in_thread
from envhub.gateway.fakes.openai_chat import FakeChat, openai_chat_app
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.server import run_in_thread
from tests.gateway.conftest import CALC_TOOL

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "hello there"}]


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = serve_in_thread(openai_chat_app(FakeChat()))
    yield server
    server.close()


def backend(server: FakeServer) -> LiteLLMBackend:
    return LiteLLMBackend(f"{server.url}/v1", model="gpt-fake", instance="hosted",
                          tokenizer=str(BUNDLED_MODEL))


def test_chatml_prompt_is_sent_as_the_original_messages(fake: FakeServer,
                                                        renderer: ChatRenderer) -> None:
    ids = renderer.render_prompt(MESSAGES, None).ids
    request = GenerateRequest(ids, SamplingParams(max_tokens=50, temperature=0.2))
    result = asyncio.run(backend(fake).generate(request))
    assert result.text == "echo: hello there" and result.completion_ids == []
    assert result.trainable is False and result.finish_reason == "stop"
    sent = fake.app.state.fake.received[-1]
    assert sent["model"] == "gpt-fake" and sent["max_tokens"] == 50
    assert [(m["role"], m["content"]) for m in sent["messages"]] == \
        [(m["role"], m["content"]) for m in MESSAGES]


def test_messages_on_the_request_win_and_tool_calls_come_back_as_text(
        fake: FakeServer) -> None:
    request = GenerateRequest([1, 2, 3], SamplingParams(max_tokens=50))
    request.messages = [{"role": "user", "content": "tool: 2+2"}]  # type: ignore[attr-defined]
    request.tools = [CALC_TOOL]  # type: ignore[attr-defined]
    result = asyncio.run(backend(fake).generate(request))
    assert result.text == '<tool_call>\n{"name":"calc","arguments":{"expr":"2+2"}}\n</tool_call>'
    assert fake.app.state.fake.received[-1]["tools"][0]["function"]["name"] == "calc"


def test_length_finish(fake: FakeServer) -> None:
    request = GenerateRequest([1], SamplingParams(max_tokens=2))
    request.messages = [{"role": "user", "content": "a b c d"}]  # type: ignore[attr-defined]
    result = asyncio.run(backend(fake).generate(request))
    assert result.finish_reason == "length" and result.text == "echo: a"


@pytest.mark.parametrize("status,error", [(429, Overloaded), (500, BackendUnavailable),
                                          (400, BadRequest)])
def test_errors_map_to_gateway_errors(fake: FakeServer, status: int, error: type) -> None:
    httpx.post(f"{fake.url}/fake/fail", json={"count": 1, "status": status})
    request = GenerateRequest([1], SamplingParams())
    request.messages = [{"role": "user", "content": "x"}]  # type: ignore[attr-defined]
    with pytest.raises(error):
        asyncio.run(backend(fake).generate(request))


def test_hosted_models_have_no_weights(fake: FakeServer) -> None:
    with pytest.raises(BadRequest, match="hosted"):
        asyncio.run(backend(fake).load_weights("/x"))


def test_model_name_is_required() -> None:
    with pytest.raises(ValueError, match="model name"):
        LiteLLMBackend("http://127.0.0.1:9/v1", model=None)


def test_chatml_parser_edge_cases() -> None:
    assert messages_from_chatml("plain text") == [{"role": "user", "content": "plain text"}]
    assert messages_from_chatml("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") == \
        [{"role": "user", "content": "hi"}]


def test_gateway_records_hosted_turns_as_text_not_trainable(fake: FakeServer,
                                                            tmp_path: Path) -> None:
    config = GatewayConfig(port=0, db=f"sqlite:///{tmp_path}/pool.db", backend="openai",
                           upstreams=[f"openai={fake.url}/v1"], model_name="gpt-fake")
    with run_in_thread(config) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="eval-1", max_retries=0)
        resp = client.chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "how are you"}])
        assert resp.choices[0].message.content == "echo: how are you"
        traj = httpx.get(f"{gw.url}/sessions/eval-1/trajectory").json()
        first = traj["turns"][0]
        assert first["trainable"] is False and first["completion_ids"] == []
        assert first["completion_text"] == "echo: how are you"
        assert first["instance"] == f"{fake.url}/v1"
        for seg in traj["segments"]:
            assert not any(seg["loss_mask"])  # nothing to train on
