"""The official `openai` client's Responses API (`client.responses`), unchanged, against a
running gateway: stream and not, function calling across turns, previous_response_id (also
across a gateway restart on the same pool), stored responses, and every turn token-exact."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from envhub.gateway.backends.scripted import ScriptedBackend
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.server import GatewayHandle
from tests.gateway.conftest import CALC_TOOL, start
from tests.support import require
from tests.support import trajectory_json as trajectory

CALC = {"type": "function", "name": "calc", "description": CALC_TOOL["function"]["description"],
        "parameters": CALC_TOOL["function"]["parameters"]}
INSTRUCTIONS = "You can use a calculator."


def client(gw: GatewayHandle, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)


def assert_token_exact(traj: dict[str, Any], backend: ScriptedBackend,
                       renderer: ChatRenderer, first: list[dict[str, Any]]) -> None:
    """TITO: one segment, no CM action; the first prompt is the template's render of the
    first request; every later prompt is the previous prompt + its sampled completion + the
    delta; the engine received exactly the recorded prompts."""
    turns = traj["turns"]
    assert len(traj["segments"]) == 1 and traj["cm_actions"] == []
    assert turns[0]["prompt_ids"] == renderer.render_prompt(first, [CALC_TOOL]).ids
    for prev, turn in zip(turns, turns[1:], strict=False):
        assert turn["prompt_ids"] == (prev["prompt_ids"] + prev["completion_ids"]
                                      + turn["prompt_delta_ids"])
        assert 0 < len(turn["prompt_delta_ids"]) < 40  # only the appended items
    received = [ids for _, ids in backend.received]
    assert received[-len(turns):] == [t["prompt_ids"] for t in turns]
    seg = traj["segments"][0]
    assert seg["token_ids"] == turns[-1]["prompt_ids"] + turns[-1]["completion_ids"]


def _echo_loop(c: openai.OpenAI, turns: int, stream: bool) -> list[Any]:
    """An agent loop that resends the whole conversation (output items echoed as input), as
    the Agents SDK does; returns the final responses of each call."""
    items: list[Any] = [{"role": "user", "content": "Compute things step by step."}]
    out = []
    for k in range(turns):
        kwargs = dict(model="gpt-5", instructions=INSTRUCTIONS, input=items, tools=[CALC])
        if stream:
            events = list(c.responses.create(stream=True, **kwargs))
            resp = events[-1].response
        else:
            resp = c.responses.create(**kwargs)
        out.append(resp)
        items += [item.model_dump(exclude_none=True) for item in resp.output]
        calls = [item for item in resp.output if item.type == "function_call"]
        items += [{"type": "function_call_output", "call_id": call.call_id,
                   "output": f"result {k}"} for call in calls]
        if not calls:
            items.append({"role": "user", "content": "Go on."})
    return out


FIRST = [{"role": "system", "content": INSTRUCTIONS},
         {"role": "user", "content": "Compute things step by step."}]


def test_function_calling_across_turns_is_token_exact(gateway, tool_script, renderer,
                                                      tmp_path):
    c = client(gateway, "resp-loop")
    responses = _echo_loop(c, 9, stream=False)
    kinds = [[item.type for item in r.output] for r in responses]
    assert kinds[:3] == [["function_call"], ["function_call"], ["message"]]
    assert responses[0].output[0].name == "calc"
    assert responses[0].output[0].arguments == '{"expr":"1+1"}'
    assert responses[2].output_text == "The answer is 6."
    assert all(r.status == "completed" and r.object == "response" for r in responses)
    traj = trajectory(gateway, "resp-loop")
    assert len(traj["turns"]) == 9  # calls == turns
    assert_token_exact(traj, tool_script, renderer, FIRST)
    for r, turn in zip(responses, traj["turns"], strict=True):
        assert r.usage.input_tokens == len(turn["prompt_ids"])
        assert r.usage.output_tokens == len(turn["completion_ids"])
    assert {t["requested_model"] for t in traj["turns"]} == {"gpt-5"}
    # the resent conversation is stored once: each response keeps only its new input items
    with sqlite3.connect(tmp_path / "pool.db") as db:
        stored = [len(json.loads(row[0])) for row in db.execute(
            "SELECT input FROM responses ORDER BY created_at")]
    assert stored == [1] * 9, stored
    listed = c.responses.input_items.list(responses[-1].id, order="asc", limit=100).data
    sent = 1 + sum(len(r.output) for r in responses[:-1]) + 8  # user, outputs, answers
    assert len(listed) == sent
    assert [i.type for i in listed[:3]] == ["message", "function_call", "function_call_output"]


def test_stream_and_non_stream_record_the_same_ids(gateway, tool_script, renderer):
    plain = _echo_loop(client(gateway, "resp-plain"), 3, stream=False)
    tool_script._next = 0
    streamed = _echo_loop(client(gateway, "resp-stream"), 3, stream=True)
    a, b = trajectory(gateway, "resp-plain"), trajectory(gateway, "resp-stream")
    for key in ("prompt_ids", "completion_ids", "completion_logprobs"):
        assert [t[key] for t in a["turns"]] == [t[key] for t in b["turns"]]
    assert_token_exact(b, tool_script, renderer, FIRST)
    for x, y in zip(plain, streamed, strict=True):
        assert [i.model_dump(exclude={"id", "call_id"}) for i in x.output] == \
            [i.model_dump(exclude={"id", "call_id"}) for i in y.output]


def test_stream_event_sequence(gateway, tool_script):
    c = client(gateway, "resp-events")
    events = list(c.responses.create(model="gpt-5", input="add", tools=[CALC], stream=True))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[3].delta == '{"expr":"1+1"}' and events[4].name == "calc"
    final = events[-1].response
    assert final.output[0].call_id == events[5].item.call_id
    tool_script._next = 2  # the plain answer, with its logprobs asked for
    events = list(c.responses.create(model="gpt-5", input="hi", stream=True,
                                     include=["message.output_text.logprobs"]))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") \
        == "The answer is 6."
    turn = trajectory(gateway, "resp-events")["turns"][-1]
    delta = next(e for e in events if e.type == "response.output_text.delta")
    assert [lp.logprob for lp in delta.logprobs] == turn["completion_logprobs"]
    # the helper that accumulates the stream agrees
    tool_script._next = 2
    with c.responses.stream(model="gpt-5", input="hi again") as stream:
        final = stream.get_final_response()
    assert final.output_text == "The answer is 6."


def test_stream_helper_and_length_limit(gateway, tool_script):
    tool_script._next = 2
    resp = client(gateway, "resp-len").responses.create(model="gpt-5", input="hi",
                                                        max_output_tokens=2)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 2


def _chain(c: openai.OpenAI, prev: str | None, item: Any) -> Any:
    return c.responses.create(model="gpt-5", instructions=INSTRUCTIONS, tools=[CALC],
                              previous_response_id=prev, input=item)


def test_previous_response_id_survives_a_restart(tmp_path: Path, renderer):
    from tests.gateway.conftest import scripted, tool_call_text

    def backend() -> ScriptedBackend:
        return scripted(renderer, [tool_call_text("1+1"), tool_call_text("2*3"), "Done: 6."])

    first_backend = backend()
    gw = start(tmp_path, first_backend)
    try:
        c = client(gw, "resp-chain")
        r1 = _chain(c, None, "Compute things step by step.")
        r2 = _chain(c, r1.id, [{"type": "function_call_output",
                                "call_id": r1.output[0].call_id, "output": "2"}])
        assert r2.previous_response_id == r1.id
        assert c.responses.retrieve(r2.id).output[0].call_id == r2.output[0].call_id
    finally:
        gw.close()
    second_backend = backend()
    second_backend._next = 2
    gw = start(tmp_path, second_backend)  # a new process on the same pool
    try:
        c = client(gw, "resp-chain")
        assert c.responses.retrieve(r1.id).output[0].call_id == r1.output[0].call_id
        r3 = _chain(c, r2.id, [{"type": "function_call_output",
                                "call_id": r2.output[0].call_id, "output": "6"}])
        assert r3.output_text == "Done: 6."
        traj = trajectory(gw, "resp-chain")
    finally:
        gw.close()
    assert len(traj["turns"]) == 3
    first_backend.received += second_backend.received
    assert_token_exact(traj, first_backend, renderer, FIRST)


def test_stored_responses(gateway, tool_script):
    c = client(gateway, "resp-store")
    r = c.responses.create(model="gpt-5", input="add", tools=[CALC], metadata={"k": "v"})
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.metadata == {"k": "v"} and got.output == r.output
    items = c.responses.input_items.list(r.id)
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]
    # another session's key sees nothing
    with pytest.raises(openai.NotFoundError):
        client(gateway, "resp-other").responses.retrieve(r.id)
    # cancel: only background responses can be cancelled
    with pytest.raises(openai.BadRequestError, match="background"):
        c.responses.cancel(r.id)
    # store: false is not retrievable nor continuable
    off = c.responses.create(model="gpt-5", input="add", tools=[CALC], store=False)
    assert off.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(off.id)
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model="gpt-5", input="x", previous_response_id=off.id)
    assert err.value.body["param"] == "previous_response_id"
    # delete: gone for GET and previous_response_id; later links still read its items
    tool_script._next = 1  # a second tool call
    r2 = c.responses.create(model="gpt-5", previous_response_id=r.id, tools=[CALC], input=[
        {"type": "function_call_output", "call_id": r.output[0].call_id, "output": "2"}])
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model="gpt-5", input="x", previous_response_id=r.id)
    r3 = c.responses.create(model="gpt-5", previous_response_id=r2.id, tools=[CALC], input=[
        {"type": "function_call_output", "call_id": r2.output[0].call_id, "output": "6"}])
    assert r3.output_text == "The answer is 6."
    with pytest.raises(openai.NotFoundError):
        c.responses.cancel("resp_nope")
    traj = trajectory(gateway, "resp-store")
    assert len(traj["turns"]) == 4  # the store: false call is recorded like any other
    # r → r2 → r3 extend one token history (the store: false call repeated r's request)
    t = traj["turns"]
    for prev, turn in ((t[0], t[2]), (t[2], t[3])):
        assert turn["prompt_ids"] == (prev["prompt_ids"] + prev["completion_ids"]
                                      + turn["prompt_delta_ids"])


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, renderer) -> Iterator[GatewayHandle]:
    """One gateway for the requests that are refused (each test uses its own session)."""
    from tests.gateway.conftest import scripted

    gw = start(tmp_path_factory.mktemp("responses"), scripted(renderer, ["The answer is 6."]))
    yield gw
    gw.close()


def _post(gw: GatewayHandle, body: dict[str, Any], key: str = "resp-bad") -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/responses", json=body,
                      headers={"authorization": f"Bearer {key}"}, timeout=60)


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "input": "x", "stream": "false"}, "stream"),
    ({"model": "m", "input": "x", "temperature": 3}, "temperature"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
     "input[0].function_call.name"),
    ({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "calc",
                               "arguments": "not json"}]}, "input[0].arguments"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "input[0].message.content[0]"),
    ({"model": "m", "input": [{"type": "web_search_call"}]}, "input[0]"),
    ({"model": "m", "input": "x", "tools": [{"type": "function", "name": "a b"}]},
     "tools[0].name"),
    ({"model": "m", "input": "x", "tools": [CALC],
      "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    ({"model": "m", "input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"model": "m", "input": "x", "background": True}, "background"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "json_schema"}}},
     "text.format"),
    ({"model": "m", "input": "x", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {"type": "objekt"}}}}, "text.format"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": "x"}, "model"),
    ({"model": "m", "input": "x", "previous_response_id": "resp_unknown"},
     "previous_response_id"),
])
def test_bad_requests_name_the_field(shared, body, param):
    r = _post(shared, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    recorded = httpx.get(f"{shared.url}/sessions/resp-bad/trajectory")
    assert recorded.status_code == 404 or recorded.json()["turns"] == []  # nothing recorded


def test_unknown_fields_are_accepted_and_named(shared):
    r = _post(shared, {"model": "m", "input": "hi", "reasoning": {"effort": "low"},
                        "include": [], "truncation": "auto", "some_new_field": 1,
                        "parallel_tool_calls": False}, key="resp-extra")
    assert r.status_code == 200, r.text
    assert r.headers["x-envhub-ignored"].split(",") == [
        "reasoning", "some_new_field", "truncation"]


def test_openapi_describes_the_body(shared):
    spec = httpx.get(f"{shared.url}/openapi.json").json()
    body = spec["paths"]["/v1/responses"]["post"]["requestBody"]
    ref = body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    props = spec["components"]["schemas"][ref]["properties"]
    assert {"input", "instructions", "tools", "tool_choice", "previous_response_id",
            "store", "stream", "max_output_tokens"} <= set(props)
    assert {"get", "delete"} <= set(spec["paths"]["/v1/responses/{response_id}"])


def test_odd_field_names_stay_out_of_the_header(shared):
    r = _post(shared, {"model": "m", "input": "hi", "caf\u00e9\U000dee4a": 1, "a,b": 2,
                       "x\ny": 3, "fine": 4}, key="resp-odd")
    assert r.status_code == 200, r.text
    assert r.headers["x-envhub-ignored"] == "fine,(+3 more)"


@pytest.mark.slow
def test_schemathesis_finds_no_server_error(shared, tmp_path: Path):
    """Bounded fuzzing of the /v1/responses operations from /openapi.json: no 5xx, and the
    methods a path does not serve answer 405."""
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    require(st is not None, "schemathesis (`pip install schemathesis`)")
    proc = subprocess.run(
        [str(st), "run", f"{shared.url}/openapi.json", "--include-path-regex",
         "^/v1/responses", "--checks", "not_a_server_error,unsupported_method",
         "--max-examples", "25", "--seed", "7", "--workers", "1",
         "--generation-database", "none", "--no-color", "--request-timeout", "30",
         "-H", "Authorization: Bearer resp-fuzz"],
        capture_output=True, text=True, timeout=500, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_resent_conversation_is_linked_after_a_restart(tmp_path: Path, renderer):
    """The Agents SDK's way (whole conversation each turn, no previous_response_id) across a
    gateway restart: each response still stores only its new items, and turns stay exact."""
    from tests.gateway.conftest import scripted, tool_call_text

    script = [tool_call_text("1+1"), tool_call_text("2*3"), "The answer is 6."]
    backends = [scripted(renderer, script), scripted(renderer, script)]
    items: list[Any] = [{"role": "user", "content": "Compute things step by step."}]
    for k, backend in enumerate(backends):
        backend._next = 2 * k
        gw = start(tmp_path, backend)
        try:
            c = client(gw, "resp-resend")
            for _ in range(2 - k):
                resp = c.responses.create(model="gpt-5", instructions=INSTRUCTIONS,
                                          input=items, tools=[CALC])
                items += [item.model_dump(exclude_none=True) for item in resp.output]
                items += [{"type": "function_call_output", "call_id": o.call_id,
                           "output": "r"} for o in resp.output if o.type == "function_call"]
            listed = c.responses.input_items.list(resp.id, order="asc", limit=100).data
            traj = trajectory(gw, "resp-resend")
        finally:
            gw.close()
    with sqlite3.connect(tmp_path / "pool.db") as db:
        stored = [len(json.loads(row[0])) for row in db.execute(
            "SELECT input FROM responses ORDER BY created_at")]
    assert stored == [1, 1, 1]
    assert resp.output_text == "The answer is 6."
    assert len(listed) == len(items) - 1  # all but the last output
    backends[0].received += backends[1].received
    assert_token_exact(traj, backends[0], renderer, FIRST)


def test_namespace_tools_are_offered_flat_and_answered_with_their_namespace(tmp_path: Path,
                                                                            renderer):
    """Codex offers each MCP server's tools as a `namespace` tool: the model sees
    `mcp__calc__calc`, the client gets `function_call` items with `namespace` and the tool's
    own name (what Codex routes by), and their echo extends the same token history."""
    from tests.gateway.conftest import scripted
    from tests.support import tool_call

    backend = scripted(renderer, [tool_call("mcp__calc__calc", {"expr": "1+1"}),
                                  "The answer is 2."])
    gw = start(tmp_path, backend)
    try:
        tools = [{"type": "namespace", "name": "mcp__calc", "description": "a calculator",
                  "tools": [CALC]}]
        items: list[Any] = [{"role": "user", "content": "Compute 1+1."}]
        http = httpx.Client(base_url=f"{gw.url}/v1", timeout=60,
                            headers={"authorization": "Bearer resp-ns"})
        first = http.post("/responses", json={"model": "gpt-5", "input": items,
                                              "tools": tools})
        assert first.status_code == 200, first.text
        call = first.json()["output"][0]
        assert (call["type"], call["namespace"], call["name"]) == (
            "function_call", "mcp__calc", "calc")
        items += [call, {"type": "function_call_output", "call_id": call["call_id"],
                         "output": "2"}]
        second = http.post("/responses", json={"model": "gpt-5", "input": items,
                                               "tools": tools})
        assert second.status_code == 200, second.text
        assert second.json()["output"][0]["content"][0]["text"] == "The answer is 2."
        traj = trajectory(gw, "resp-ns")
    finally:
        gw.close()
    assert [[c["name"] for c in t["tool_calls"]] for t in traj["turns"]] == [
        ["mcp__calc__calc"], []]
    first_prompt = [{"role": "user", "content": "Compute 1+1."}]
    flat = {"type": "function", "function": {**CALC_TOOL["function"],
                                             "name": "mcp__calc__calc"}}
    assert traj["turns"][0]["prompt_ids"] == renderer.render_prompt(first_prompt, [flat]).ids
    assert len(traj["segments"]) == 1 and traj["cm_actions"] == []
    a, b = traj["turns"]
    assert b["prompt_ids"] == a["prompt_ids"] + a["completion_ids"] + b["prompt_delta_ids"]


def test_a_function_tool_and_a_namespace_tool_of_the_same_qualified_name_are_refused(
        tmp_path: Path, renderer):
    """`mcp__calc__calc` offered flat next to namespace `mcp__calc`'s `calc`: the model would
    see two identical tools and its call could not be routed, so the request is a 400."""
    from tests.gateway.conftest import scripted

    gw = start(tmp_path, scripted(renderer, ["unused"]))
    try:
        http = httpx.Client(base_url=f"{gw.url}/v1", timeout=60,
                            headers={"authorization": "Bearer resp-dup"})
        flat = {**CALC, "name": "mcp__calc__calc"}
        answer = http.post("/responses", json={"model": "gpt-5", "input": "Compute 1+1.",
                                               "tools": [flat, {"type": "namespace",
                                                                "name": "mcp__calc",
                                                                "tools": [CALC]}]})
    finally:
        gw.close()
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "'mcp__calc__calc'" in error["message"] and error["param"] == "tools", error
