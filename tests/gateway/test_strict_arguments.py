"""A strict function's call under tool_choice auto (sampled without a grammar) reaches the client
only when its arguments match the function's schema, closed (no undeclared key) with the
schema's own `required`: otherwise the answer is the model's text with a text finish reason and
the turn records `invalid_tool_arguments` — chat, Responses (strict unless a tool says false)
and Anthropic (`strict: true` tools), streamed and not. A function that is not strict is not
checked; a schema that cannot be checked safely is a 400 before anything runs, and nothing in
a schema is fetched or run as a regex."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from envhub.gateway.server import GatewayHandle
from tests.gateway.conftest import client as anthropic_client
from tests.gateway.conftest import openai_client
from tests.support import gateway_in_thread, scripted_backend, tool_call, trajectory_json

# what pydantic's model_json_schema() writes: no additionalProperties, defaulted field optional
PYDANTIC_PARAMS = {"type": "object", "title": "Weather",
                   "properties": {"city": {"type": "string", "title": "City"},
                                  "units": {"type": "string", "default": "C"}},
                   "required": ["city"]}
STRICT = {"type": "function", "function": {"name": "get_weather", "strict": True,
                                           "parameters": PYDANTIC_PARAMS}}
LOOSE = {"type": "function", "function": {"name": "get_weather",
                                          "parameters": PYDANTIC_PARAMS}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": PYDANTIC_PARAMS}
ANTHROPIC_STRICT = {"name": "get_weather", "input_schema": PYDANTIC_PARAMS, "strict": True}
ANTHROPIC_LOOSE = {"name": "get_weather", "input_schema": PYDANTIC_PARAMS}
# an extra key (strict objects are closed); `city` left out (the schema requires it); `units`
# left out is fine (the model was shown the schema, where it is optional)
EXTRA = tool_call("get_weather", {"city": "Paris", "units": "C", "country": "FR"})
MISSING = tool_call("get_weather", {"units": "C"})
GOOD = tool_call("get_weather", {"city": "Paris"})
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayHandle]:
    """A model that always calls get_weather with a key its schema does not have."""
    handle = gateway_in_thread(tmp_path_factory.mktemp("strict-args"), scripted_backend([EXTRA]))
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def gw_missing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayHandle]:
    """A model that always leaves `city` out."""
    handle = gateway_in_thread(tmp_path_factory.mktemp("strict-args-missing"),
                               scripted_backend([MISSING]))
    yield handle
    handle.close()


chat = openai_client



def signals(gw: GatewayHandle, key: str) -> list[dict]:
    return [s for s in trajectory_json(gw, key)["signals"] if s["name"] == "invalid_tool_arguments"]


def test_chat_refuses_extra_and_missing_keys(gw: GatewayHandle,
                                            gw_missing: GatewayHandle) -> None:
    for server, expected, error in ((gw, EXTRA, "'country' was unexpected"),
                                    (gw_missing, MISSING, "'city' is a required property")):
        r = chat(server, "sa-chat").chat.completions.create(model="m", messages=ASK,
                                                            tools=[STRICT])
        choice = r.choices[0]
        assert choice.message.tool_calls is None and choice.message.content == expected
        assert choice.finish_reason == "stop"
        assert [len(t["tool_calls"]) for t in trajectory_json(server, "sa-chat")["turns"]] == [0]
        [signal] = signals(server, "sa-chat")
        assert signal["seq"] == 0 and signal["info"]["tool"] == "get_weather"
        assert error in signal["info"]["error"], signal


def test_a_matching_call_is_a_call(tmp_path: Path) -> None:
    server = gateway_in_thread(tmp_path, scripted_backend([GOOD]))
    try:
        r = chat(server, "sa-good").chat.completions.create(model="m", messages=ASK,
                                                            tools=[STRICT])
        [call] = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
        m = anthropic_client(server, "sa-good-anth").messages.create(
            model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_STRICT])
        assert [b.type for b in m.content] == ["tool_use"] and m.stop_reason == "tool_use"
        assert not signals(server, "sa-good") and not signals(server, "sa-good-anth")
    finally:
        server.close()


def test_chat_stream(gw: GatewayHandle) -> None:
    chunks = list(chat(gw, "sa-stream").chat.completions.create(
        model="m", messages=ASK, tools=[STRICT], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.tool_calls for d in deltas)
    assert "".join(d.content or "" for d in deltas) == EXTRA
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert len(signals(gw, "sa-stream")) == 1


def test_a_function_that_is_not_strict_is_not_checked(gw: GatewayHandle) -> None:
    r = chat(gw, "sa-loose").chat.completions.create(model="m", messages=ASK, tools=[LOOSE])
    [call] = r.choices[0].message.tool_calls
    assert "country" in call.function.arguments and not signals(gw, "sa-loose")
    m = anthropic_client(gw, "sa-anth-loose").messages.create(
        model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_LOOSE])
    assert [b.type for b in m.content] == ["tool_use"] and m.stop_reason == "tool_use"


def test_responses_strict_by_default_and_false_opts_out(gw: GatewayHandle) -> None:
    r = chat(gw, "sa-resp").responses.create(model="m", input=ASK[0]["content"],
                                             tools=[RESPONSES_TOOL])
    assert [item.type for item in r.output] == ["message"] and r.output_text == EXTRA
    assert len(signals(gw, "sa-resp")) == 1
    events = list(chat(gw, "sa-resp-stream").responses.create(
        model="m", input=ASK[0]["content"], tools=[RESPONSES_TOOL], stream=True))
    assert not any(e.type.startswith("response.function_call") for e in events)
    assert events[-1].response.output_text == EXTRA
    r = chat(gw, "sa-resp-loose").responses.create(
        model="m", input=ASK[0]["content"], tools=[{**RESPONSES_TOOL, "strict": False}])
    assert [item.type for item in r.output] == ["function_call"]
    assert not signals(gw, "sa-resp-loose")


def test_anthropic_strict_tool(gw: GatewayHandle) -> None:
    r = anthropic_client(gw, "sa-anth").messages.create(
        model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_STRICT])
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == EXTRA
    assert r.stop_reason == "end_turn"
    with anthropic_client(gw, "sa-anth").messages.stream(
            model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_STRICT]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == EXTRA
    assert len(signals(gw, "sa-anth")) == 2


def test_what_strict_mode_does_not_support_is_a_400_under_auto(gw: GatewayHandle) -> None:
    one_of = {"type": "function", "function": {"name": "get_weather", "strict": True,
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"oneOf": [{"type": "string"}]}}}}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(gw, "sa-400").chat.completions.create(model="m", messages=ASK, tools=[one_of])
    assert "oneOf" in str(e.value) and "properties.city" in str(e.value)
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client(gw, "sa-400-anth").messages.create(
            model="m", max_tokens=64, messages=ASK, tools=[{**ANTHROPIC_STRICT, "strict": 1}])
    assert trajectory_json(gw, "sa-400")["turns"] == []


def strict_tool(parameters: dict, name: str = "get_weather") -> dict:
    return {"type": "function", "function": {"name": name, "strict": True,
                                             "parameters": parameters}}


def one_call(tmp_path: Path, arguments: dict, tools: list[dict]) -> tuple[object, list[dict]]:
    """The answer to one chat call whose model calls get_weather(arguments), and the turn's
    invalid_tool_arguments signals."""
    server = gateway_in_thread(tmp_path, scripted_backend([tool_call("get_weather", arguments)]))
    try:
        r = chat(server, "sa-one").chat.completions.create(model="m", messages=ASK, tools=tools,
                                                           max_tokens=8192)
        return r.choices[0], signals(server, "sa-one")
    finally:
        server.close()


@pytest.mark.parametrize("parameters, named", [
    ({"type": "object", "properties": {"city": {"$ref": "http://127.0.0.1:9/s.json"}}},
     "not a reference inside the schema"),
    ({"type": "object", "properties": {"city": {"$ref": "file:///etc/hostname"}}},
     "not a reference inside the schema"),
    ({"type": "object", "properties": {"city": {"$ref": "#/$defs/nope"}}}, "points to nothing"),
    # an index no int() reads cheaply (a superscript two; 5,000 digits): was an uncaught
    # ValueError, a 500
    ({"type": "object", "$defs": {"l": {"anyOf": [{"type": "string"}]}},
      "properties": {"city": {"$ref": "#/$defs/l/anyOf/\u00b2"}}}, "points to nothing"),
    ({"type": "object", "$defs": {"l": {"anyOf": [{"type": "string"}]}},
      "properties": {"city": {"$ref": "#/$defs/l/anyOf/" + "9" * 5000}}}, "points to nothing"),
    ({"type": "object", "properties": {"city": {"type": "strin"}}}, "not a valid JSON Schema"),
    ({"type": "object", "properties": {"city": {"type": "string", "minLength": "3"}}},
     "not a valid JSON Schema"),
])
def test_a_schema_that_cannot_be_checked_is_a_400_and_nothing_is_fetched(
        gw: GatewayHandle, parameters: dict, named: str) -> None:
    with pytest.raises(openai.BadRequestError, match=named):
        chat(gw, "sa-bad-schema").chat.completions.create(
            model="m", messages=ASK, tools=[strict_tool(parameters)])
    assert trajectory_json(gw, "sa-bad-schema")["turns"] == []


def test_two_tools_of_one_name_are_a_400(gw: GatewayHandle) -> None:
    with pytest.raises(openai.BadRequestError, match="two tools are named 'get_weather'"):
        chat(gw, "sa-dup").chat.completions.create(model="m", messages=ASK,
                                                   tools=[STRICT, LOOSE])


def test_patterns_are_not_run_against_the_models_output(tmp_path: Path) -> None:
    """A client's regex is neither Python's dialect nor safe to backtrack over the model's text
    (`^(a+)+$` against 'aaa…!' would hold the gateway for hours): not checked."""
    params = {"type": "object", "properties": {
        "city": {"type": "string", "pattern": "^(a+)+$"},
        "units": {"type": "string", "pattern": "^\\p{L}+$"}}, "required": ["city"]}
    choice, found = one_call(tmp_path, {"city": "a" * 40 + "!", "units": "°"},
                             [strict_tool(params)])
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and not found


def test_a_check_that_recurses_without_end_is_refused_not_a_500(tmp_path: Path) -> None:
    """A schema whose references loop without consuming the arguments (x -> y -> x): checking
    any value recurses until Python's limit; the call is refused, the turn recorded."""
    loop = {"type": "object", "properties": {"city": {"$ref": "#/$defs/x"}},
            "$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}}}
    choice, found = one_call(tmp_path, {"city": "Paris"}, [strict_tool(loop)])
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert [s["info"]["error"] for s in found] == [
        "the arguments could not be checked: the schema or the arguments recurse too deeply"]


def test_responses_default_strict_falls_back_where_strict_mode_cannot_say_it(
        tmp_path: Path) -> None:
    """Responses tools are strict by default; one whose schema strict mode cannot express
    (an open map) is not refused for it unless it says strict true itself."""
    open_map = {"type": "object", "properties": {"city": {"type": "string"}},
                "additionalProperties": True}
    server = gateway_in_thread(tmp_path, scripted_backend([EXTRA]))
    try:
        c = chat(server, "sa-resp-map")
        r = c.responses.create(model="m", input=ASK[0]["content"], tools=[
            {"type": "function", "name": "get_weather", "parameters": open_map}])
        assert [item.type for item in r.output] == ["function_call"]
        with pytest.raises(openai.BadRequestError, match="additionalProperties"):
            c.responses.create(model="m", input=ASK[0]["content"], tools=[
                {"type": "function", "name": "get_weather", "parameters": open_map,
                 "strict": True}])
    finally:
        server.close()


def nested(depth: int) -> dict:
    schema: dict = {"type": "object", "properties": {"city": {"type": "string"}}}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def test_a_schema_too_deep_to_check_is_a_400_when_strict_is_said(gw: GatewayHandle) -> None:
    """120 nested objects: the metaschema check recurses past Python's limit; 150: deeper than
    the pool's JSON writer goes (254 levels), for any tool list."""
    with pytest.raises(openai.BadRequestError, match="nested too deeply to check"):
        chat(gw, "sa-deep").chat.completions.create(
            model="m", messages=ASK, tools=[strict_tool(nested(120))])
    with pytest.raises(openai.BadRequestError, match="deeper than 254 levels"):
        chat(gw, "sa-deeper").chat.completions.create(
            model="m", messages=ASK, tools=[{**LOOSE, "function": {
                **LOOSE["function"], "parameters": nested(150)}}])
    # strict by Responses' default only: not checked, not refused
    r = chat(gw, "sa-deep-resp").responses.create(model="m", input=ASK[0]["content"], tools=[
        {"type": "function", "name": "get_weather", "parameters": nested(120)}])
    assert [item.type for item in r.output] == ["function_call"]


@pytest.mark.parametrize("limit", [None, 20_000])
def test_the_depth_refusal_is_the_same_whatever_the_recursion_limit(gw: GatewayHandle,
                                                                    limit: int | None) -> None:
    """The same schema gets the same answer in any process: the check counts levels before
    anything recurses, so a limit raised by other code (torch's inductor sets 2,000 or more,
    hypothesis raises it while it runs) no longer lets a deep schema through (before: no 400
    after such code ran in the worker). 30 nested objects are checked; 31 and 120 refused,
    in the chat and Anthropic APIs alike."""
    before = sys.getrecursionlimit()
    if limit is not None:
        sys.setrecursionlimit(limit)
    try:
        for depth in (31, 120):
            with pytest.raises(openai.BadRequestError, match="nested too deeply to check"):
                chat(gw, f"sa-limit-{limit}-{depth}").chat.completions.create(
                    model="m", messages=ASK, tools=[strict_tool(nested(depth))])
            with pytest.raises(anthropic.BadRequestError, match="nested too deeply to check"):
                anthropic_client(gw, f"sa-limit-a-{limit}-{depth}").messages.create(
                    model="m", max_tokens=16, messages=ASK,
                    output_config={"format": {"type": "json_schema",
                                              "schema": nested(depth)}})
        r = chat(gw, f"sa-limit-{limit}-30").chat.completions.create(
            model="m", messages=ASK, tools=[strict_tool(nested(30))])
        assert r.choices[0].finish_reason  # checked, answered
    finally:
        sys.setrecursionlimit(before)


def test_references_by_encoded_pointer_resolve_and_anchors_are_refused(tmp_path: Path) -> None:
    params = {"type": "object", "properties": {"city": {"$ref": "#/$defs/A%20B"}},
              "$defs": {"A B": {"type": "string"}}, "required": ["city"]}
    choice, found = one_call(tmp_path, {"city": "Paris"}, [strict_tool(params)])
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert not found
    anchored = {**params, "properties": {"city": {"$ref": "#place"}}}
    (tmp_path / "anchor").mkdir()
    server = gateway_in_thread(tmp_path / "anchor", scripted_backend([GOOD]))
    try:
        with pytest.raises(openai.BadRequestError, match="is an anchor"):
            chat(server, "sa-anchor").chat.completions.create(
                model="m", messages=ASK, tools=[strict_tool(anchored)])
    finally:
        server.close()
