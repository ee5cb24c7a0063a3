"""Bad input on /v1/messages gets a 4xx in Anthropic's error shape; the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from envhub.gateway.backends.scripted import ScriptedBackend
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.server import GatewayHandle
from tests.gateway.conftest import CALC, client, scripted, start
from tests.support import trajectory_json as trajectory

USER = [{"role": "user", "content": "hi"}]
OK = {"model": "default", "max_tokens": 16, "messages": USER}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, renderer: ChatRenderer) -> Iterator[GatewayHandle]:
    """One gateway for the module (each test uses its own session key): starting one per
    test would cost more than the tests."""
    # an explicit alias table: names it does not match get 404 (without one, any name serves)
    handle = start(tmp_path_factory.mktemp("anthropic-errors"), scripted(renderer, ["Fine."]),
                   model_aliases=["claude-*-4-5=default"])
    yield handle
    handle.close()


def post(gw: GatewayHandle, body=None, content=None, key="bad-a", path="/v1/messages",
         headers=None) -> httpx.Response:
    h = {"x-api-key": key, "anthropic-version": "2023-06-01", **(headers or {})}
    return httpx.post(f"{gw.url}{path}", json=body, content=content, headers=h, timeout=60)


def assert_error(resp: httpx.Response, status: int, kind: str, words: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind, body
    assert words in body["error"]["message"], body


def still_serving(gw: GatewayHandle) -> None:
    assert post(gw, OK).status_code == 200


@pytest.mark.parametrize("content,words", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
])
def test_malformed_json(gateway, content, words):
    assert_error(post(gateway, content=content, headers={"content-type": "application/json"}),
                 400, "invalid_request_error", words)
    still_serving(gateway)


def tool_use(**over):
    return {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"expr": "1"}, **over}


@pytest.mark.parametrize("change,words", [
    ({"max_tokens": None}, "'max_tokens' is required"),
    ({"max_tokens": 0}, "'max_tokens' must be an integer ≥ 1 and ≤ 1048576; got 0"),
    ({"max_tokens": "16"}, "'max_tokens' must be an integer"),
    ({"max_tokens": 1e9}, "'max_tokens' must be an integer ≥ 1 and ≤ 1048576; got 1000000000.0"),
    ({"max_tokens": 1 << 30}, "≤ 1048576"),
    ({"model": None}, "'model' is required"),
    ({"messages": []}, "non-empty list"),
    ({"messages": "hi"}, "non-empty list"),
    ({"messages": [{"role": "system", "content": "x"}]}, "top-level 'system'"),
    ({"messages": [{"role": "user"}]}, "content is required"),
    ({"messages": [{"role": "user", "content": []}]}, "must not be empty"),
    ({"messages": [{"role": "user", "content": 7}]}, "string or a list of content blocks"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "'image' is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "content[0].text must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "tool_use_id"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]},
     "content[0].content[0]"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]}, "is_error"),
    ({"messages": [USER[0], {"role": "assistant", "content": [tool_use(id=None)]}, USER[0]]},
     "needs {'type': 'tool_use'"),
    ({"messages": [USER[0], {"role": "assistant", "content": [tool_use(input="1")]}, USER[0]]},
     "needs {'type': 'tool_use'"),
    ({"messages": [USER[0], {"role": "assistant", "content": "sure"}]}, "prefill"),
    ({"system": [{"type": "image"}]}, "system[0]"),
    ({"system": 5}, "system.content must be a string"),
    ({"temperature": 2.5}, "'temperature' must be a number in [0.0, 2.0]"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "t"}]}]},
     "must come before any text"),
    ({"top_p": 0}, "'top_p'"),
    ({"top_k": -1}, "'top_k'"),
    ({"stop_sequences": "END"}, "'stop_sequences'"),
    ({"stop_sequences": [""]}, "'stop_sequences'"),
    ({"stream": "yes"}, "'stream' must be a JSON boolean"),
    ({"stream": "false"}, "'stream' must be a JSON boolean"),
    ({"stream": 1}, "'stream' must be a JSON boolean"),
    ({"metadata": "user-1"}, "'metadata' must be an object"),
])
def test_bad_requests(gateway, change, words):
    body = {**OK, **change}
    body = {k: v for k, v in body.items() if v is not None}
    assert_error(post(gateway, body), 400, "invalid_request_error", words)
    still_serving(gateway)


@pytest.mark.parametrize("tools,choice,words", [
    ([{"name": "calc"}], None, "input_schema must be a JSON Schema object"),
    ([{**CALC, "input_schema": {"type": "array"}}], None, "input_schema"),
    ([{**CALC, "name": "bad name!"}], None, "tools[0].name"),
    ([{**CALC, "description": 3}], None, "description must be a string"),
    ([{"type": "web_search_20250305", "name": "web_search"}], None, "only client tools"),
    ({"calc": CALC}, None, "'tools' must be a list"),
    ([CALC], {"type": "sometimes"}, "'tool_choice' must be"),
    ([CALC], "auto", "'tool_choice' must be"),
    ([CALC], {"type": "tool", "name": "search"}, "not in 'tools'"),
])
def test_bad_tools(gateway, tools, choice, words):
    body = {**OK, "tools": tools}
    if choice is not None:
        body["tool_choice"] = choice
    assert_error(post(gateway, body), 400, "invalid_request_error", words)
    still_serving(gateway)


def test_unknown_model_is_not_found(gateway):
    with pytest.raises(anthropic.NotFoundError) as err:
        client(gateway, "bad-model").messages.create(model="claude-x", max_tokens=8,
                                                     messages=USER)
    assert err.value.body["error"]["type"] == "not_found_error"
    assert "served: default, tiny" in err.value.body["error"]["message"]


def test_errors_through_the_official_client(gateway):
    c = client(gateway, "bad-client")
    with pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model="default", max_tokens=8,
                          messages=[{"role": "user", "content": [{"type": "image"}]}])
    assert err.value.body["type"] == "error"
    stream = c.messages.stream(model="default", max_tokens=8, messages=[])
    with pytest.raises(anthropic.BadRequestError), stream:  # refused before any event
        pass
    # validation comes first: not even the session was opened, nothing is half-recorded
    assert httpx.get(f"{gateway.url}/sessions/bad-client").status_code == 404


def test_wrong_method_names_the_allowed_ones(gateway):
    r = httpx.get(f"{gateway.url}/v1/messages")
    assert_error(r, 405, "invalid_request_error", "Method Not Allowed")
    assert r.headers["allow"] == "POST"
    assert_error(httpx.get(f"{gateway.url}/v1/messages/nothing"), 404, "not_found_error",
                 "Not Found")


def test_count_tokens_errors(gateway):
    assert_error(post(gateway, {"model": "default"}, path="/v1/messages/count_tokens"), 400,
                 "invalid_request_error", "non-empty list")
    assert_error(post(gateway, {"model": "nope", "messages": USER},
                      path="/v1/messages/count_tokens"), 404, "not_found_error", "nope")
    ok = post(gateway, {"model": "default", "messages": USER}, path="/v1/messages/count_tokens")
    assert ok.status_code == 200 and ok.json()["input_tokens"] > 0


def test_count_tokens_refuses_what_messages_refuses(gateway):
    """A strict tool whose schema strict mode does not support, and a chain header it does not
    understand, are 400s on both routes: count_tokens counts only what /v1/messages would send."""
    tool = {"name": "pick", "strict": True,
            "input_schema": {"type": "object",
                             "properties": {"x": {"oneOf": [{"type": "string"},
                                                            {"type": "integer"}]}}}}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        assert_error(post(gateway, {**OK, "tools": [tool]}, path=path, key="bad-count"), 400,
                     "invalid_request_error", "strict mode does not support 'oneOf'")
        assert_error(post(gateway, OK, path=path, key="bad-count",
                          headers={"x-envhub-chain": "old"}), 400,
                     "invalid_request_error", "send 'new'")
    counted = post(gateway, OK, path="/v1/messages/count_tokens", key="bad-count",
                   headers={"x-envhub-chain": "new"})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0, counted.text


def test_closed_session_conflicts(gateway):
    assert post(gateway, OK, key="bad-closed").status_code == 200
    r = httpx.post(f"{gateway.url}/sessions/bad-closed/close", json={"status": "done"})
    assert r.status_code == 200, r.text
    assert_error(post(gateway, OK, key="bad-closed"), 409, "invalid_request_error",
                 "open a new session")


def test_ignored_fields_are_named(gateway):
    r = post(gateway, {**OK, "top_k": 5, "thinking": {"type": "disabled"},
                       "metadata": {"user_id": "u"}})
    assert r.status_code == 200, r.text
    assert r.headers["x-envhub-ignored"] == "metadata,thinking,top_k"
    assert "x-envhub-ignored" not in post(gateway, OK).headers


def test_count_tokens_leaves_a_declared_action_for_the_next_call(gateway):
    key = "bad-declared"
    assert post(gateway, OK, key=key).status_code == 200
    r = httpx.post(f"{gateway.url}/sessions/{key}/context_action",
                   json={"kind": "truncate", "info": {"why": "test"}})
    assert r.status_code == 200, r.text
    counted = post(gateway, {"model": "default", "messages": USER},
                   path="/v1/messages/count_tokens", key=key)
    assert counted.status_code == 200
    assert post(gateway, OK, key=key).status_code == 200
    [action] = trajectory(gateway, key)["cm_actions"]
    assert action["source"] == "declared" and action["info"]["why"] == "test"


@pytest.fixture
def locked_gateway(tmp_path: Path, tool_script: ScriptedBackend) -> Iterator[GatewayHandle]:
    handle = start(tmp_path, tool_script, admin_key="admin-secret")
    yield handle
    handle.close()


def test_authentication_errors(locked_gateway):
    assert_error(post(locked_gateway, OK, key="stranger"), 401, "authentication_error",
                 "POST /sessions")
    r = httpx.post(f"{locked_gateway.url}/v1/messages", json=OK, timeout=60)
    assert_error(r, 401, "authentication_error", "missing API key")
    made = httpx.post(f"{locked_gateway.url}/sessions", json={},
                      headers={"authorization": "Bearer admin-secret"})
    assert made.status_code == 201, made.text
    resp = client(locked_gateway, made.json()["api_key"]).messages.create(
        model="default", max_tokens=8, messages=USER)
    assert resp.usage.output_tokens > 0


def test_unknown_fields_with_any_name_are_named_safely(gateway):
    """A field name a header cannot carry (not latin-1, a comma) is counted, not sent: this
    used to be a 500."""
    r = post(gateway, {**OK, "名前": 1, "a,b": 2, "x_extra": 3})
    assert r.status_code == 200, r.text
    assert r.headers["x-envhub-ignored"] == "x_extra,(+2 more)"
