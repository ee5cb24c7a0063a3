"""Bad input gets a 4xx in OpenAI's error shape, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.conftest import CALC_TOOL, start

OK = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}


def post(gw, body=None, content=None, key="bad-1", path="/v1/chat/completions", headers=None):
    h = {"authorization": f"Bearer {key}", **(headers or {})}
    return httpx.post(f"{gw.url}{path}", json=body, content=content, headers=h, timeout=60)


def assert_error(resp, status, words):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert words in err["message"], err
    assert set(err) >= {"message", "type", "param", "code"}


def still_serving(gw):
    assert post(gw, OK).status_code == 200


@pytest.mark.parametrize("content,words", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
])
def test_malformed_json(gateway, content, words):
    assert_error(post(gateway, content=content, headers={"content-type": "application/json"}),
                 400, words)
    still_serving(gateway)


@pytest.mark.parametrize("messages,words", [
    ([{"role": "wizard", "content": "x"}], "role is 'wizard'"),
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "text parts"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}], "tool_calls[0]"),
])
def test_wrong_messages(gateway, messages, words):
    assert_error(post(gateway, {"model": "default", "messages": messages}), 400, words)
    still_serving(gateway)


@pytest.mark.parametrize("tools,words", [
    ([{"type": "function"}], "tools[0]"),
    ([{"type": "function", "function": {"name": "bad name!"}}], "function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
     "JSON Schema object"),
    ({"calc": {}}, "list of function tools"),
])
def test_invalid_tool_schemas(gateway, tools, words):
    assert_error(post(gateway, {**OK, "tools": tools}), 400, words)
    still_serving(gateway)


@pytest.mark.parametrize("extra,param", [
    ({"temperature": 7}, "temperature"), ({"max_tokens": 0}, "max_tokens"),
    ({"n": 0}, "n"), ({"stop": [1]}, "stop"), ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"top_p": "high"}, "top_p"),
])
def test_bad_sampling_params(gateway, extra, param):
    resp = post(gateway, {**OK, **extra})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    still_serving(gateway)


def test_unknown_model(gateway):
    assert_error(post(gateway, {**OK, "model": "gpt-9"}), 404, "does not exist")
    assert_error(post(gateway, {"messages": OK["messages"]}), 400, "'model' is required")
    still_serving(gateway)


def test_body_over_default_limit(gateway):
    big = b'{"model": "default", "messages": [{"role": "user", "content": "' + \
        b"x" * (64 << 20) + b'"}]}'
    assert_error(post(gateway, content=big, headers={"content-type": "application/json"}),
                 413, "exceeds the limit")
    still_serving(gateway)


def test_chunked_body_over_limit(tmp_path, tool_script):
    gw = start(tmp_path, tool_script, max_body_bytes=4096)
    try:
        def chunks():
            for _ in range(10):
                yield b"x" * 1024
        assert_error(post(gw, content=chunks(), headers={"content-type": "application/json"}),
                     413, "exceeds the limit")
        still_serving(gw)
    finally:
        gw.close()


def test_prompt_over_context_length(tmp_path, tool_script):
    gw = start(tmp_path, tool_script, max_model_len=64)
    try:
        resp = post(gw, {"model": "default", "messages": [
            {"role": "user", "content": "word " * 200}], "tools": [CALC_TOOL]})
        assert_error(resp, 400, "shorten the conversation")
        still_serving(gw)
    finally:
        gw.close()


def test_unknown_route_and_method(gateway):
    assert httpx.get(f"{gateway.url}/v2/nothing").status_code == 404
    assert httpx.get(f"{gateway.url}/v1/chat/completions").status_code == 405
    still_serving(gateway)
