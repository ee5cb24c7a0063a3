"""`strict: true` means OpenAI's strict mode: objects closed and every property required (also
for schemas that do not say so, as instructor / LangChain send them), and a 400 naming what
strict mode does not support; on the bundled model through the official client. Anthropic's
JSON outputs (output_config.format) mean the same."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from envhub.gateway.errors import BadRequest
from envhub.gateway.server import GatewayHandle
from envhub.gateway.strict import strict_schema
from tests.gateway.conftest import client as anthropic_client
from tests.gateway.conftest import openai_client

pytest.importorskip("llguidance")

ASK = [{"role": "user", "content": "How long is the table? Answer in JSON."}]


class Length(BaseModel):
    answer: int = Field(ge=0, le=999)
    unit: Literal["cm", "m"] = "cm"  # defaulted: pydantic leaves it out of `required`


# what the weather function's caller wrote: open object, `unit` optional
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                         "unit": {"enum": ["C", "F"]}},
        "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "weather", "description": "the weather",
                                            "strict": True, "parameters": CITY}}


@pytest.fixture(scope="module")
def gw(bundled_gw: GatewayHandle) -> GatewayHandle:
    return bundled_gw


client = openai_client


def test_parse_with_a_pydantic_model(gw: GatewayHandle) -> None:
    r = client(gw, "strict-parse").chat.completions.parse(
        model="m", messages=ASK, response_format=Length, seed=0, max_tokens=40)
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Length)
    assert set(json.loads(choice.message.content)) == {"answer", "unit"}


@pytest.mark.parametrize("seed", [0, 1])
def test_instructor_style_schema_comes_back_closed(gw: GatewayHandle, seed: int) -> None:
    schema = Length.model_json_schema()
    assert "additionalProperties" not in schema and schema["required"] == ["answer"]
    r = client(gw, f"strict-instructor-{seed}").chat.completions.create(
        model="m", messages=ASK, seed=seed, max_tokens=40, response_format={
            "type": "json_schema",
            "json_schema": {"name": "length", "schema": schema, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    assert set(json.loads(r.choices[0].message.content)) == {"answer", "unit"}


def test_forced_call_to_a_strict_function_has_exactly_its_keys(gw: GatewayHandle) -> None:
    r = client(gw, "strict-tool").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather?"}], seed=2, max_tokens=48,
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "weather"}})
    [call] = r.choices[0].message.tool_calls
    assert set(json.loads(call.function.arguments)) == {"city", "unit"}


def test_responses_function_tools_are_strict_by_default(gw: GatewayHandle) -> None:
    r = client(gw, "strict-responses").responses.create(
        model="m", input="Weather?", max_output_tokens=48,
        tools=[{"type": "function", "name": "weather", "parameters": CITY}],
        tool_choice={"type": "function", "name": "weather"})
    [call] = [item for item in r.output if item.type == "function_call"]
    assert set(json.loads(call.arguments)) == {"city", "unit"}


@pytest.mark.parametrize("schema, named", [
    ({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"},
                                                       {"type": "integer"}]}}}, "'oneOf'"),
    ({"type": "object", "properties": {"a": {"type": "string"}},
      "additionalProperties": {"type": "string"}}, "additionalProperties"),
    ({"anyOf": [{"type": "object"}, {"type": "string"}]}, "root must be an object"),
])
def test_unsupported_strict_schema_is_a_400_naming_it(gw: GatewayHandle, schema: dict,
                                                       named: str) -> None:
    with pytest.raises(openai.BadRequestError, match=named) as e:
        client(gw, "strict-bad").chat.completions.create(
            model="m", messages=ASK, max_tokens=8, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                       "strict": True}})
    assert e.value.body["param"] == "response_format.json_schema.schema"


def test_unsupported_strict_tool_schema_is_a_400(gw: GatewayHandle) -> None:
    bad = {**WEATHER["function"], "parameters": {**CITY, "patternProperties": {"^x": {}}}}
    r = httpx.post(f"{gw.url}/v1/chat/completions", headers={"authorization": "Bearer strict-t"},
                   json={"model": "m", "messages": ASK, "tools": [{"type": "function",
                                                                   "function": bad}],
                         "tool_choice": "required"}, timeout=60)
    assert r.status_code == 400 and "'patternProperties'" in r.json()["error"]["message"]
    assert "function 'weather'" in r.json()["error"]["message"]


def test_normaliser_closes_nested_and_referenced_objects() -> None:
    class Item(BaseModel):
        name: str
        qty: int = 1

    class Order(BaseModel):
        items: list[Item]
        note: str | None = None

    out = strict_schema(Order.model_json_schema(), "s", "p")
    assert out["additionalProperties"] is False and out["required"] == ["items", "note"]
    assert out["$defs"]["Item"]["required"] == ["name", "qty"]
    assert out["$defs"]["Item"]["additionalProperties"] is False
    # a one-schema allOf (older pydantic's $ref wrapper) is unwrapped; a root $ref is allowed
    wrapped = {"$ref": "#/$defs/O", "$defs": {"O": {"type": "object", "properties": {
        "x": {"allOf": [{"$ref": "#/$defs/I"}], "description": "d"}}},
        "I": {"type": "object", "properties": {}}}}
    out = strict_schema(wrapped, "s", "p")
    assert out["$defs"]["O"]["properties"]["x"] == {"$ref": "#/$defs/I", "description": "d"}
    with pytest.raises(BadRequest, match="'allOf' .at properties.x"):
        strict_schema({"type": "object", "properties": {"x": {"allOf": [{}, {}]}}}, "s", "p")



class Verdict(BaseModel):
    unit: Literal["cm", "m"]
    exact: bool = False  # defaulted: left out of `required`


def test_anthropic_parse_with_a_pydantic_model(gw: GatewayHandle) -> None:
    """The official SDK's messages.parse sends output_config.format (its schema loses numeric
    bounds, which Anthropic does not take: hence a model without numbers): JSON outputs follow
    the schema (closed, every property present) and end the turn."""
    r = anthropic_client(gw, "strict-anth-parse").messages.parse(
        model="m", max_tokens=40, messages=ASK, output_format=Verdict)
    assert r.stop_reason == "end_turn" and isinstance(r.parsed_output, Verdict)
    assert set(json.loads(r.content[0].text)) == {"unit", "exact"}


def test_anthropic_json_output_closes_a_pydantic_schema(gw: GatewayHandle) -> None:
    """An open schema as pydantic writes it, through output_config and the beta's
    output_format; effort is named as ignored."""
    schema = Length.model_json_schema()
    for key, extra in (("strict-anth-config", {"output_config": {
            "format": {"type": "json_schema", "schema": schema}, "effort": "low"}}),
            ("strict-anth-beta", {"output_format": {"type": "json_schema",
                                                    "schema": schema}})):
        r = httpx.post(f"{gw.url}/v1/messages", headers={"x-api-key": key}, json={
            "model": "m", "max_tokens": 40, "messages": ASK, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["stop_reason"] == "end_turn"
        assert set(json.loads(body["content"][0]["text"])) == {"answer", "unit"}
        assert ("output_config.effort" in r.headers.get("x-envhub-ignored", "")) == (
            "output_config" in extra)


def deep_schema(depth: int) -> dict:
    schema: dict = {"type": "object", "properties": {"a": {"type": "string"}}}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize("extra, named", [
    ({"output_config": {"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}}}}}, "'oneOf'"),
    ({"output_config": {"format": {"type": "json_schema", "schema": deep_schema(130)}}},
     "nested too deeply to check"),  # counted before the JSON writer's 254 levels
    ({"output_config": {"format": {"type": "text"}}}, "output_config.format must be"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
      "output_format": {"type": "json_schema", "schema": {"type": "object"}}}, "once"),
])
def test_anthropic_bad_json_output_is_a_400(gw: GatewayHandle, extra: dict, named: str) -> None:
    """On /v1/messages and on count_tokens alike; the message names no OpenAI field."""
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = httpx.post(f"{gw.url}{path}", headers={"x-api-key": "strict-anth-bad"}, json={
            "model": "m", "max_tokens": 8, "messages": ASK, **extra}, timeout=60)
        assert r.status_code == 400, (path, r.text)
        assert named in r.json()["error"]["message"]
        assert "response_format" not in r.json()["error"]["message"]
        assert "strict false" not in r.json()["error"]["message"]


def test_anthropic_json_output_with_tools_still_calls_them(gw: GatewayHandle) -> None:
    """JSON outputs bind the answer, not a turn that calls a tool: the bundled model calls a
    declared tool under output_config (it could only write the JSON before); unknown
    output_config keys are named as ignored."""
    submit = {"name": "submit", "input_schema": {"type": "object", "properties": {
        "answer": {"type": "string"}}, "required": ["answer"]}}
    weather = {"name": "get_weather", "input_schema": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}
    turns = [{"role": "user", "content": "What is the weather in Paris?"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1",
                                                "name": "get_weather",
                                                "input": {"city": "Paris"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                           "content": "21"}]}]
    r = httpx.post(f"{gw.url}/v1/messages", headers={"x-api-key": "strict-anth-tools"}, json={
        "model": "m", "max_tokens": 48, "temperature": 0.0, "messages": turns,
        "tools": [weather, submit], "output_config": {
            "format": {"type": "json_schema", "schema": Length.model_json_schema()},
            "future": "x"}}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [b["type"] for b in body["content"]] == ["tool_use"], body
    assert body["content"][0]["name"] in ("submit", "get_weather")
    assert body["stop_reason"] == "tool_use"
    assert "output_config.future" in r.headers["x-envhub-ignored"]


def test_a_hosted_model_is_sent_the_closed_output_schema() -> None:
    from envhub.gateway.anthropic_convert import constraint, json_output
    from tests.support import bundled_renderer

    made = constraint(bundled_renderer(), None, None, json_output(
        None, {"type": "json_schema", "schema": Length.model_json_schema()}))
    assert made is not None
    sent = made.request["response_format"]["json_schema"]
    assert sent["strict"] is True and sent["schema"]["additionalProperties"] is False
    assert sent["schema"]["required"] == ["answer", "unit"]
