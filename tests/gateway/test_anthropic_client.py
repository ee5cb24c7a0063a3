"""The official `anthropic` client, unchanged, against a running gateway (/v1/messages)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from envhub.gateway.anthropic_api import stop_sequence
from envhub.gateway.backends.base import GenerateResult
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.render.toolcalls import ParsedCompletion
from envhub.gateway.server import GatewayHandle
from envhub.gateway.service import Choice
from tests.gateway.conftest import CALC, client, scripted, start, tool_call_text
from tests.support import trajectory_json as trajectory

SYSTEM = "You can use a calculator."


def test_non_streaming_tool_use(gateway):
    resp = client(gateway, "a-1").messages.create(
        model="default", max_tokens=64, tools=[CALC],
        messages=[{"role": "user", "content": "add"}])
    assert resp.type == "message" and resp.role == "assistant" and resp.id.startswith("msg_")
    assert resp.stop_reason == "tool_use" and resp.stop_sequence is None
    [use] = resp.content
    assert use.type == "tool_use" and use.id.startswith("toolu_")
    assert use.name == "calc" and use.input == {"expr": "1+1"}
    turn = trajectory(gateway, "a-1")["turns"][0]
    assert resp.usage.input_tokens == len(turn["prompt_ids"])
    assert resp.usage.output_tokens == len(turn["completion_ids"])
    assert turn["tool_calls"][0]["name"] == "calc"


def test_plain_text_end_turn(gateway, tool_script):
    tool_script._next = 2  # the plain answer
    resp = client(gateway, "a-text").messages.create(
        model="default", max_tokens=64, system=SYSTEM,
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert [b.type for b in resp.content] == ["text"]
    assert resp.content[0].text == "The answer is 6."
    assert resp.stop_reason == "end_turn"


def test_max_tokens_stop_reason(gateway, tool_script):
    tool_script._next = 2
    resp = client(gateway, "a-len").messages.create(
        model="default", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert resp.stop_reason == "max_tokens" and resp.usage.output_tokens == 2


def test_stream_helper_matches_record(gateway):
    c = client(gateway, "a-stream")
    with c.messages.stream(model="default", max_tokens=64, tools=[CALC],
                           messages=[{"role": "user", "content": "add"}]) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "message_delta" in events
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use" and final.content[0].input == {"expr": "1+1"}
    turn = trajectory(gateway, "a-stream")["turns"][0]
    assert final.usage.output_tokens == len(turn["completion_ids"])
    assert final.usage.input_tokens == len(turn["prompt_ids"])


def test_stream_true_raw_events(gateway, tool_script):
    tool_script._next = 2
    events = list(client(gateway, "a-raw").messages.create(
        model="default", max_tokens=64, stream=True,
        messages=[{"role": "user", "content": "hi"}]))
    kinds = [e.type for e in events]
    assert kinds == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert events[0].message.content == [] and events[0].message.stop_reason is None
    assert events[1].content_block.type == "text" and events[1].content_block.text == ""
    assert events[2].delta.type == "text_delta" and events[2].delta.text == "The answer is 6."
    assert events[4].delta.stop_reason == "end_turn"
    turn = trajectory(gateway, "a-raw")["turns"][0]
    assert events[4].usage.output_tokens == len(turn["completion_ids"])
    # message_delta's usage is complete (LangChain reads input_tokens there, not in
    # message_start): the same numbers as the non-streaming response's usage
    assert events[4].usage.input_tokens == len(turn["prompt_ids"])
    start = events[0].message.usage
    assert events[4].usage.cache_read_input_tokens == start.cache_read_input_tokens
    assert events[4].usage.cache_creation_input_tokens == start.cache_creation_input_tokens


def test_stream_message_delta_usage_on_the_wire(gateway):
    body = {"model": "default", "max_tokens": 64, "stream": True, "tools": [CALC],
            "messages": [{"role": "user", "content": "add"}]}
    r = httpx.post(f"{gateway.url}/v1/messages", json=body,
                   headers={"x-api-key": "a-usage", "anthropic-version": "2023-06-01"}, timeout=60)
    delta = next(json.loads(line.removeprefix("data: ")) for line in r.text.splitlines()
                 if line.startswith("data: ") and '"message_delta"' in line)
    whole = httpx.post(f"{gateway.url}/v1/messages", json={**body, "stream": False},
                       headers={"x-api-key": "a-usage-2", "anthropic-version": "2023-06-01"},
                       timeout=60)
    assert set(delta["usage"]) == set(whole.json()["usage"]) == {
        "input_tokens", "output_tokens", "cache_creation_input_tokens",
        "cache_read_input_tokens"}
    turn = trajectory(gateway, "a-usage")["turns"][0]
    assert delta["usage"]["input_tokens"] == len(turn["prompt_ids"])
    assert delta["usage"]["output_tokens"] == len(turn["completion_ids"])


def test_sse_wire_format(gateway):
    """Every SSE frame names its event, and the data's `type` repeats it (Anthropic's format)."""
    body = {"model": "default", "max_tokens": 64, "stream": True, "tools": [CALC],
            "messages": [{"role": "user", "content": "add"}]}
    r = httpx.post(f"{gateway.url}/v1/messages", json=body,
                   headers={"x-api-key": "a-wire", "anthropic-version": "2023-06-01"}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in r.text.split("\n\n") if f.strip()]
    names = []
    for frame in frames:
        event, data = frame.split("\n")
        name = event.removeprefix("event: ")
        assert data.startswith("data: ") and f'"type":"{name}"' in data
        names.append(name)
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert '"type":"input_json_delta","partial_json":"{\\"expr\\":\\"1+1\\"}"' in r.text


@pytest.fixture
def mixed_script(renderer: ChatRenderer):
    """Text + call, a call, two calls at once, a plain answer: every content shape."""
    two = tool_call_text("3-1") + "\n" + tool_call_text("4/2")
    return scripted(renderer, ["Let me compute.\n" + tool_call_text("1+1"),
                               tool_call_text("2*3"), two, "So far so good."])


@pytest.fixture
def mixed_gateway(tmp_path: Path, mixed_script) -> Iterator[GatewayHandle]:
    handle = start(tmp_path, mixed_script)
    yield handle
    handle.close()


def test_twelve_turn_tool_use_conversation_is_token_exact(mixed_gateway, mixed_script):
    gw, c, n = mixed_gateway, client(mixed_gateway, "a-12"), 12
    msgs: list[dict] = [{"role": "user", "content": "Compute things step by step."}]
    counted = []
    for k in range(n):
        args = {"model": "default", "max_tokens": 256, "system": SYSTEM, "messages": msgs,
                "tools": [CALC]}
        counted.append(c.messages.count_tokens(model="default", system=SYSTEM, messages=msgs,
                                               tools=[CALC]).input_tokens)
        if k % 2:  # streamed turns are echoed from the accumulated final message
            with c.messages.stream(**args) as stream:
                resp = stream.get_final_message()
        else:
            resp = c.messages.create(**args)
        msgs.append({"role": "assistant", "content": resp.content})  # echoed unchanged
        uses = [b for b in resp.content if b.type == "tool_use"]
        if uses:
            assert resp.stop_reason == "tool_use"
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": f"result {k}.{j}"}
                for j, u in enumerate(uses)]})
        else:
            msgs.append({"role": "user", "content": "Go on."})
    assert {len([b for b in m["content"] if b.type == "tool_use"])
            for m in msgs if m["role"] == "assistant"} == {0, 1, 2}
    traj = trajectory(gw, "a-12")
    turns = traj["turns"]
    assert len(turns) == n and len(traj["segments"]) == 1 and traj["cm_actions"] == []
    for k in range(1, n):
        assert turns[k]["prompt_ids"] == (turns[k - 1]["prompt_ids"] + turns[k - 1]
                                          ["completion_ids"] + turns[k]["prompt_delta_ids"])
        assert len(turns[k]["prompt_delta_ids"]) < 60  # only the appended messages
    # the engine received exactly the recorded prompts, and count_tokens predicted them
    assert [ids for _, ids in mixed_script.received] == [t["prompt_ids"] for t in turns]
    assert counted == [len(t["prompt_ids"]) for t in turns]
    seg = traj["segments"][0]
    assert seg["token_ids"] == turns[-1]["prompt_ids"] + turns[-1]["completion_ids"]
    assert sum(seg["loss_mask"]) == sum(len(t["completion_ids"]) for t in turns)


def test_blocks_render_into_the_prompt(gateway, renderer: ChatRenderer):
    """System blocks, tool_result (with is_error) and text reach the template as the system,
    tool and user messages the chat template renders."""
    c = client(gateway, "a-render")
    system = [{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two."}]
    first = c.messages.create(model="default", max_tokens=64, system=system, tools=[CALC],
                              messages=[{"role": "user", "content": "add"}])
    [use] = first.content
    c.messages.create(model="default", max_tokens=64, system=system, tools=[CALC], messages=[
        {"role": "user", "content": "add"}, {"role": "assistant", "content": first.content},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "is_error": True,
             "content": [{"type": "text", "text": "division by zero"}]},
            {"type": "text", "text": "try again"}]}])
    turns = trajectory(gateway, "a-render")["turns"]
    assert renderer.decode(turns[0]["prompt_ids"]).count("Rule one.\n\nRule two.") == 1
    delta = renderer.decode(turns[1]["prompt_delta_ids"])
    assert "<tool_response>\nError: division by zero\n</tool_response>" in delta
    assert delta.index("division by zero") < delta.index("user\ntry again")
    assert len(trajectory(gateway, "a-render")["segments"]) == 1


def test_count_tokens_records_nothing(gateway):
    c = client(gateway, "a-count")
    n = c.messages.count_tokens(model="default", system=SYSTEM, tools=[CALC],
                                messages=[{"role": "user", "content": "add"}]).input_tokens
    assert trajectory(gateway, "a-count")["turns"] == []
    resp = c.messages.create(model="default", max_tokens=64, system=SYSTEM, tools=[CALC],
                             messages=[{"role": "user", "content": "add"}])
    assert n == resp.usage.input_tokens == len(trajectory(gateway, "a-count")["turns"][0]
                                               ["prompt_ids"])


def test_url_form_and_bearer_auth(gateway):
    c = anthropic.Anthropic(base_url=f"{gateway.url}/s/a-path", api_key="ignored",
                            max_retries=0)
    c.messages.create(model="default", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert len(trajectory(gateway, "a-path")["turns"]) == 1
    r = httpx.post(f"{gateway.url}/v1/messages", headers={"authorization": "Bearer a-bearer"},
                   json={"model": "default", "max_tokens": 8,
                         "messages": [{"role": "user", "content": "x"}]}, timeout=60)
    assert r.status_code == 200 and r.headers["request-id"] == r.json()["id"]
    assert len(trajectory(gateway, "a-bearer")["turns"]) == 1


def test_stop_sequence_detected_from_tail(renderer: ChatRenderer):
    """Backends that do not name the matched stop (vLLM's completions shape as we parse it):
    detected from the last tokens; an EOS ending is end_turn even if the text contains it."""
    def choice(text: str, eos: bool) -> Choice:
        ids = renderer.encode(text) + ([renderer.stop_token_ids[0]] if eos else [])
        res = GenerateResult(ids, [-1.0] * len(ids), "stop", 0)
        return Choice(0, res, ParsedCompletion(content=text), [], "stop")

    assert stop_sequence(choice("count: 1, 2, 3 END", False), ["END", "3"], renderer) == "END"
    assert stop_sequence(choice("count: 1, 2, 3 END", True), ["END"], renderer) is None
    assert stop_sequence(choice("count: 1, 2", False), ["END"], renderer) is None


@pytest.fixture(scope="module")
def engine_gateway(tmp_path_factory) -> Iterator[GatewayHandle]:
    """The real embedded engine on the bundled tiny model (greedy decoding is deterministic)."""
    pytest.importorskip("torch")
    handle = start(tmp_path_factory.mktemp("engine"), None)
    yield handle
    handle.close()


def test_stop_sequence_with_the_embedded_engine(engine_gateway):
    msgs = [{"role": "user", "content": "Say hello"}]
    free = client(engine_gateway, "a-eng-1").messages.create(
        model="default", max_tokens=24, temperature=0, messages=msgs)
    text = free.content[0].text
    word = re.search(r"[A-Za-z]{4,}", text[1:])
    assert word is not None, f"the greedy text has no ASCII word to stop on: {text!r}"
    stop = word.group(0)[:4]
    resp = client(engine_gateway, "a-eng-2").messages.create(
        model="default", max_tokens=24, temperature=0, messages=msgs,
        stop_sequences=["\x01never\x01", stop])
    assert resp.stop_reason == "stop_sequence" and resp.stop_sequence == stop
    got = resp.content[0].text
    # the sampled text up to (and including) the token completing the stop sequence is kept
    assert stop in got and text.startswith(got) and len(got) < len(text)
    turn = trajectory(engine_gateway, "a-eng-2")["turns"][0]
    assert resp.usage.output_tokens == len(turn["completion_ids"])


def test_a_system_message_inside_messages_renders_in_place(gateway, renderer: ChatRenderer):
    """Claude Code (2.1, default model) puts per-turn instructions in a role 'system' message
    after the first user message: rendered as a system block at that place, and the next call
    still extends the recorded history (one segment)."""
    c = client(gateway, "a-midsystem")
    history: list = [{"role": "user", "content": "add"},
                     {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}]
    first = c.messages.create(model="claude-opus-5-5", max_tokens=32, system=SYSTEM,
                              messages=history)
    c.messages.create(model="claude-opus-5-5", max_tokens=32, system=SYSTEM, messages=[
        *history, {"role": "assistant", "content": first.content},
        {"role": "user", "content": "again"}])
    turns = trajectory(gateway, "a-midsystem")["turns"]
    prompt = renderer.decode(turns[0]["prompt_ids"])
    assert prompt.index("user\nadd") < prompt.index("system\nBe brief.") < prompt.rindex(
        "assistant")
    assert len(trajectory(gateway, "a-midsystem")["segments"]) == 1
    # an empty one (Claude Code after /compact) is rendered as sent; first place is refused
    c.messages.create(model="x", max_tokens=8, messages=[
        {"role": "user", "content": "a"}, {"role": "system", "content": ""}])
    assert "system\n<|im_end|>" in renderer.decode(
        trajectory(gateway, "a-midsystem")["turns"][-1]["prompt_ids"])
    with pytest.raises(anthropic.BadRequestError, match="after the first message"):
        c.messages.create(model="x", max_tokens=8, messages=[
            {"role": "system", "content": "a"}, {"role": "user", "content": "b"}])
