"""Structured outputs: response_format and forced tool calls are honoured by constrained
decoding in the embedded engine (llguidance), with the official openai client and LangChain,
on the bundled model; backends that cannot constrain answer 400."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest
import torch

from envhub.gateway.engine import BUNDLED_MODEL
from envhub.gateway.server import GatewayHandle
from tests.gateway.conftest import CALC_TOOL, openai_client
from tests.support import gateway_in_thread, scripted_backend

pytest.importorskip("llguidance")

# bounded: the arith-tuned tiny model would otherwise write digits until the token budget ends
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0,
                                                      "maximum": 999},
                                            "unit": {"enum": ["cm", "m"]}},
          "required": ["answer", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "How long is the table? Answer in JSON."}]


@pytest.fixture(scope="module")
def gw(bundled_gw: GatewayHandle) -> GatewayHandle:
    return bundled_gw


client = openai_client


def trajectory(gw: GatewayHandle, key: str) -> dict:
    return httpx.get(f"{gw.url}/sessions/{key}/trajectory").json()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_output_is_valid(gw: GatewayHandle, seed: int) -> None:
    r = client(gw, f"so-schema-{seed}").chat.completions.create(
        model="m", messages=ASK, seed=seed, max_tokens=40, temperature=1.0,
        response_format={"type": "json_schema", "json_schema": {
            "name": "answer", "schema": ANSWER, "strict": True}})
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice  # the grammar ended it, not the budget
    value = json.loads(choice.message.content)
    assert set(value) == {"answer", "unit"} and isinstance(value["answer"], int)
    assert value["unit"] in ("cm", "m")


def test_json_object_output_is_an_object(gw: GatewayHandle) -> None:
    r = client(gw, "so-object").chat.completions.create(
        model="m", messages=ASK, seed=3, max_tokens=40,
        response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # out of budget mid-object (as OpenAI): still a prefix of an object
        assert r.choices[0].message.content.lstrip().startswith("{")


def test_recorded_logprobs_are_of_the_masked_distribution(gw: GatewayHandle) -> None:
    """The engine reports log_softmax over the tokens the grammar allowed: never below the
    model's unconstrained logprob of the same token, and strictly above it where the grammar
    removed probability mass (documented in gateway/structured.py)."""
    from transformers import AutoModelForCausalLM

    key = "so-logprobs"
    client(gw, key).chat.completions.create(
        model="m", messages=ASK, seed=4, max_tokens=24, temperature=1.0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}})
    turn = trajectory(gw, key)["turns"][0]
    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    ids = turn["prompt_ids"] + turn["completion_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    full = torch.log_softmax(logits, -1)
    n = len(turn["prompt_ids"])
    unconstrained = [float(full[n - 1 + i, t]) for i, t in enumerate(turn["completion_ids"])]
    gaps = [rec - free for rec, free in zip(turn["completion_logprobs"], unconstrained,
                                            strict=True)]
    assert min(gaps) > -1e-3, gaps
    assert max(gaps) > 0.1, gaps  # the first token alone loses most of the model's mass


def test_tool_choice_required_forces_a_call(gw: GatewayHandle) -> None:
    r = client(gw, "so-required").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello!"}], seed=5, max_tokens=64,
        tools=[CALC_TOOL, WEATHER], tool_choice="required")
    calls = r.choices[0].message.tool_calls
    assert calls and all(c.function.name in ("calc", "weather") for c in calls)
    for c in calls:
        json.loads(c.function.arguments)
    assert r.choices[0].finish_reason == "tool_calls"


def test_a_format_binds_the_answer_not_a_forced_or_chosen_call(gw: GatewayHandle) -> None:
    """response_format with tools: a forced call is still a call (the format binds a text
    answer, which a forced turn has none of); under auto the answer is the JSON or the calls."""
    fmt = {"type": "json_object"}
    r = client(gw, "so-format-required").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello!"}], seed=5, max_tokens=64,
        tools=[CALC_TOOL, WEATHER], tool_choice="required", response_format=fmt)
    assert r.choices[0].message.tool_calls and r.choices[0].finish_reason == "tool_calls"
    for seed in range(3):
        r = client(gw, f"so-format-auto-{seed}").chat.completions.create(
            model="m", messages=ASK, seed=seed, max_tokens=64, tools=[CALC_TOOL],
            parallel_tool_calls=False, response_format={
                "type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}})
        message = r.choices[0].message
        assert message.tool_calls or set(json.loads(message.content)) == {"answer", "unit"}


def test_named_tool_choice_and_no_parallel_calls(gw: GatewayHandle) -> None:
    r = client(gw, "so-named").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What is 2+2?"}], seed=6,
        max_tokens=64, tools=[CALC_TOOL, WEATHER], parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "weather"}})
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["weather"]
    assert set(json.loads(calls[0].function.arguments)) == {"city"}


def test_langchain_with_structured_output_json_schema(gw: GatewayHandle) -> None:
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Length(BaseModel):
        answer: int = Field(ge=0, le=999)
        unit: Literal["cm", "m"]

    llm = ChatOpenAI(base_url=f"{gw.url}/v1", api_key="so-langchain", model="m",
                     max_retries=0, max_completion_tokens=40, seed=7)
    out = llm.with_structured_output(Length, method="json_schema").invoke(
        "How long is the table?")
    assert isinstance(out, Length)


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objekt"}}}}, "response_format"),
    ({"parallel_tool_calls": "no", "tools": [CALC_TOOL]}, "parallel_tool_calls"),
])
def test_bad_structured_requests_are_400(gw: GatewayHandle, body: dict, param: str) -> None:
    r = httpx.post(f"{gw.url}/v1/chat/completions", headers={"authorization": "Bearer so-bad"},
                   json={"model": "m", "messages": ASK, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert trajectory(gw, "so-bad").get("turns", []) == []


def test_backend_that_cannot_constrain_says_so(tmp_path: Path) -> None:
    gw = gateway_in_thread(tmp_path, scripted_backend(["{}"]))
    try:
        with pytest.raises(openai.BadRequestError, match="cannot constrain"):
            client(gw, "so-scripted").chat.completions.create(
                model="m", messages=ASK, response_format={"type": "json_object"})
    finally:
        gw.close()


def test_anthropic_tool_choice_any_and_tool_force_calls(gw: GatewayHandle) -> None:
    import anthropic

    c = anthropic.Anthropic(base_url=gw.url, api_key="so-anthropic", max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in (CALC_TOOL, WEATHER)]
    msg = [{"role": "user", "content": "Hello!"}]
    r = c.messages.create(model="m", max_tokens=64, messages=msg, tools=tools,
                          tool_choice={"type": "any"})
    assert r.stop_reason == "tool_use" and any(b.type == "tool_use" for b in r.content)
    r = c.messages.create(model="m", max_tokens=64, messages=msg, tools=tools,
                          tool_choice={"type": "tool", "name": "weather",
                                       "disable_parallel_tool_use": True})
    uses = [b for b in r.content if b.type == "tool_use"]
    assert [u.name for u in uses] == ["weather"] and set(uses[0].input) == {"city"}


def test_responses_api_structured_output_and_forced_call(gw: GatewayHandle) -> None:
    """The Responses route honours text.format json_schema and a named tool_choice too."""
    c = client(gw, "so-responses")
    r = c.responses.create(model="m", input="How long is the table?", max_output_tokens=40,
                           text={"format": {"type": "json_schema", "name": "answer",
                                            "schema": ANSWER, "strict": True}})
    assert r.status == "completed" and set(json.loads(r.output_text)) == {"answer", "unit"}
    assert r.text.format.type == "json_schema"
    tools = [{"type": "function", "name": fn["function"]["name"],
              "description": fn["function"]["description"],
              "parameters": fn["function"]["parameters"]} for fn in (CALC_TOOL, WEATHER)]
    r = c.responses.create(model="m", input="Hello!", max_output_tokens=64, tools=tools,
                           tool_choice={"type": "function", "name": "weather"},
                           parallel_tool_calls=False)
    calls = [item for item in r.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["weather"]
    assert set(json.loads(calls[0].arguments)) == {"city"}
