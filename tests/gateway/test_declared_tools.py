"""Only declared tools come back as calls (chat, Responses, Anthropic; streamed and not): a call
to a tool the request did not offer, or any call under tool_choice none or without tools, comes
back as the model's text with a text finish reason, and the turn records `undeclared_tool`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from envhub.gateway.server import GatewayHandle
from tests.gateway.conftest import client as anthropic_client
from tests.gateway.conftest import openai_client
from tests.support import gateway_in_thread, scripted_backend, tool_call, trajectory_json

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}
ANTHROPIC_WEATHER = {"name": "get_weather", "description": "the weather in a city",
                     "input_schema": WEATHER["function"]["parameters"]}
SUBMIT = tool_call("submit", {"answer": "sunny"})
CALL = tool_call("get_weather", {"city": "Paris"})
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayHandle]:
    """A model that always calls `submit`, which no request here declares."""
    handle = gateway_in_thread(tmp_path_factory.mktemp("undeclared"), scripted_backend([SUBMIT]))
    yield handle
    handle.close()


chat = openai_client


def recorded(gw: GatewayHandle, key: str, why: str = "not among the request's tools") -> None:
    """The turn lists no tool call and carries the undeclared_tool signal."""
    traj = trajectory_json(gw, key)
    assert [t["tool_calls"] for t in traj["turns"]] == [[]]
    [signal] = [s for s in traj["signals"] if s["name"] == "undeclared_tool"]
    assert signal["seq"] == 0 and signal["info"]["tools"] == ["submit"]
    assert signal["info"]["why"].startswith(why), signal


def test_chat(gw: GatewayHandle) -> None:
    r = chat(gw, "ud-chat").chat.completions.create(model="m", messages=ASK, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.message.tool_calls is None and choice.message.content == SUBMIT
    assert choice.finish_reason == "stop"
    recorded(gw, "ud-chat")


def test_chat_stream(gw: GatewayHandle) -> None:
    chunks = list(chat(gw, "ud-chat-stream").chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.tool_calls for d in deltas)
    assert "".join(d.content or "" for d in deltas) == SUBMIT
    assert chunks[-1].choices[0].finish_reason == "stop"
    recorded(gw, "ud-chat-stream")


def test_echoed_text_answer_extends_the_turn(gw: GatewayHandle) -> None:
    """The text answer, sent back as the assistant message, still matches the recorded turn."""
    c = chat(gw, "ud-echo")
    r = c.chat.completions.create(model="m", messages=ASK, tools=[WEATHER])
    echo = [*ASK, r.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Use get_weather."}]
    c.chat.completions.create(model="m", messages=echo, tools=[WEATHER])
    turns = trajectory_json(gw, "ud-echo")["turns"]
    assert [t["segment"] for t in turns] == [0, 0]  # extended, not a new segment


def test_tool_choice_none_and_no_tools(gw: GatewayHandle) -> None:
    r = chat(gw, "ud-none").chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    recorded(gw, "ud-none", "tool_choice is none")
    r = chat(gw, "ud-no-tools").chat.completions.create(model="m", messages=ASK)
    assert r.choices[0].message.content == SUBMIT and r.choices[0].finish_reason == "stop"
    recorded(gw, "ud-no-tools", "the request declared no tools")


def test_responses(gw: GatewayHandle) -> None:
    r = chat(gw, "ud-resp").responses.create(model="m", input=ASK[0]["content"],
                                             tools=[RESPONSES_WEATHER])
    assert [item.type for item in r.output] == ["message"]
    assert r.output_text == SUBMIT and r.status == "completed"
    recorded(gw, "ud-resp")


def test_responses_stream(gw: GatewayHandle) -> None:
    events = list(chat(gw, "ud-resp-stream").responses.create(
        model="m", input=ASK[0]["content"], tools=[RESPONSES_WEATHER], stream=True))
    assert not any(e.type.startswith("response.function_call") for e in events)
    final = events[-1]
    assert final.type == "response.completed" and final.response.output_text == SUBMIT
    recorded(gw, "ud-resp-stream")



def test_anthropic(gw: GatewayHandle) -> None:
    r = anthropic_client(gw, "ud-anth").messages.create(
        model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_WEATHER])
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == SUBMIT
    assert r.stop_reason == "end_turn"
    recorded(gw, "ud-anth")


def test_anthropic_stream_and_tool_choice_none(gw: GatewayHandle) -> None:
    with anthropic_client(gw, "ud-anth-stream").messages.stream(
            model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_WEATHER]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == SUBMIT
    assert final.stop_reason == "end_turn"
    recorded(gw, "ud-anth-stream")
    r = anthropic_client(gw, "ud-anth-none").messages.create(
        model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_WEATHER],
        tool_choice={"type": "none"})
    assert [b.type for b in r.content] == ["text"] and r.stop_reason == "end_turn"
    recorded(gw, "ud-anth-none", "tool_choice is none")


def test_a_declared_call_is_still_a_call(tmp_path: Path) -> None:
    gw = gateway_in_thread(tmp_path, scripted_backend([CALL]))
    try:
        r = chat(gw, "ud-declared").chat.completions.create(model="m", messages=ASK,
                                                            tools=[WEATHER])
        [call] = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
        r2 = chat(gw, "ud-declared-resp").responses.create(
            model="m", input=ASK[0]["content"], tools=[RESPONSES_WEATHER])
        assert [item.type for item in r2.output] == ["function_call"]
        m = anthropic_client(gw, "ud-declared-anth").messages.create(
            model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_WEATHER])
        assert [b.type for b in m.content] == ["tool_use"] and m.stop_reason == "tool_use"
        traj = trajectory_json(gw, "ud-declared")
        assert [c["name"] for c in traj["turns"][0]["tool_calls"]] == ["get_weather"]
        assert not [s for s in traj["signals"] if s["name"] == "undeclared_tool"]
    finally:
        gw.close()


def test_bundled_model_submit_after_a_weather_result_comes_back_as_text(tmp_path: Path) -> None:
    """The bundled model learned `submit` on arith: after a tool result it calls submit, which
    this weather request does not declare (every seed we tried, greedy or at temperature 1).
    The same conversation through chat, Responses and Messages, streamed and not: no call comes
    back, the text does, and each turn records undeclared_tool."""
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.engine import BUNDLED_MODEL
    from envhub.gateway.server import run_in_thread

    gw = run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{tmp_path}/pool.db", backend="local",
                                     model=str(BUNDLED_MODEL)))
    asked = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21"}]
    items = [ASK[0], {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                      "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "21"}]
    turns = [ASK[0], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                      "content": "21"}]}]
    submit = '<tool_call>\n{"name": "submit"'
    greedy = {"temperature": 0.0, "max_tokens": 48}
    try:
        for stream in (False, True):
            key = f"ud-bundled-{stream}"
            if stream:
                chunks = list(chat(gw, key).chat.completions.create(
                    model="m", messages=asked, tools=[WEATHER], stream=True, **greedy))
                deltas = [c.choices[0].delta for c in chunks if c.choices]
                assert not any(d.tool_calls for d in deltas)
                text = "".join(d.content or "" for d in deltas)
                assert chunks[-1].choices[0].finish_reason == "stop"
            else:
                choice = chat(gw, key).chat.completions.create(
                    model="m", messages=asked, tools=[WEATHER], **greedy).choices[0]
                assert choice.message.tool_calls is None and choice.finish_reason == "stop"
                text = choice.message.content
            assert text.startswith(submit), text
            recorded(gw, key)

            key = f"ud-bundled-resp-{stream}"
            resp = chat(gw, key).responses.create(
                model="m", input=items, tools=[RESPONSES_WEATHER], stream=stream,
                temperature=0.0, max_output_tokens=48)
            if stream:
                events = list(resp)
                assert not any(e.type.startswith("response.function_call") for e in events)
                resp = events[-1].response
            assert [item.type for item in resp.output] == ["message"]
            assert resp.output_text.startswith(submit), resp.output_text
            recorded(gw, key)

            key = f"ud-bundled-anth-{stream}"
            c = anthropic_client(gw, key)
            if stream:
                with c.messages.stream(model="m", messages=turns, tools=[ANTHROPIC_WEATHER],
                                       **greedy) as s:
                    m = s.get_final_message()
            else:
                m = c.messages.create(model="m", messages=turns, tools=[ANTHROPIC_WEATHER],
                                      **greedy)
            assert [b.type for b in m.content] == ["text"] and m.stop_reason == "end_turn"
            assert m.content[0].text.startswith(submit), m.content[0].text
            recorded(gw, key)
    finally:
        gw.close()
