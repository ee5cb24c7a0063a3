"""Two `envhub gateway` processes sharing a real PostgreSQL pool behind a real nginx running
deploy/nginx/envhub.conf (consistent hash of the session key), driven by the official openai
client: sessions stick to one process, every turn is recorded once and token-exact, streams
pass through, and when one process is killed its sessions continue on the other."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import defaultdict

import anthropic
import httpx
import openai
import pytest

from tests.nginx import NginxProxy
from tests.support import bundled_renderer, free_port, start_gateway

pytestmark = [pytest.mark.postgres, pytest.mark.nginx, pytest.mark.slow]

ADMIN = "admin-nginx-test"


@pytest.fixture(scope="module")
def fleet(postgres_server):
    """(nginx, gateway processes, their ports) over one fresh database, shared by this file's
    tests (starting gateways is the slow part); the kill test comes last."""
    db = postgres_server.create_database()
    ports = [free_port(), free_port()]
    proxy = NginxProxy(ports)
    procs = [start_gateway(db, p, ["--admin-key", ADMIN, "--public-url", proxy.url])
             for p in ports]
    try:
        proxy.start()
        yield proxy, procs, ports
    finally:
        proxy.stop()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def new_sessions(url: str, prefix: str, n: int) -> dict[str, str]:
    """n sessions created through the proxy: {session id: its key}."""
    keys = {}
    for i in range(n):
        r = httpx.post(f"{url}/sessions", json={"session_id": f"{prefix}-{i}"},
                       headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["base_url"] == f"{url}/v1"  # --public-url: agents are sent to the proxy
        keys[body["session_id"]] = body["api_key"]
    return keys


async def converse(url: str, sid: str, key: str, turns: int, log: dict, messages: list) -> None:
    """`turns` calls of one agent; logs (seq, serving process, content) per answer."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    for _ in range(turns):
        if not messages:
            messages.append({"role": "user", "content": f"task of {sid}"})
        raw = await client.chat.completions.with_raw_response.create(
            model="default", messages=messages, max_tokens=6)
        resp = raw.parse()
        log[sid].append((resp.model_extra["envhub"]["seqs"][0], raw.headers["x-envhub-gateway"],
                         resp.choices[0].message.content))
        messages += [resp.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": f"go on ({len(messages)})"}]
    await client.close()


def run_sessions(url: str, keys: dict[str, str], turns: int, log: dict, convs: dict) -> None:
    async def all_of_them() -> None:
        await asyncio.gather(*(converse(url, sid, key, turns, log, convs[sid])
                               for sid, key in keys.items()))

    asyncio.run(all_of_them())


def assert_recorded_once_token_exact(url: str, sid: str, answers: list) -> None:
    t = httpx.get(f"{url}/sessions/{sid}/trajectory",
                  headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).json()
    seqs = [turn["seq"] for turn in t["turns"]]
    assert seqs == [seq for seq, _, _ in answers] == list(range(len(answers))), sid
    assert t["cm_actions"] == [], sid  # one conversation, extended every turn
    [segment] = t["segments"]
    turns = {turn["seq"]: turn for turn in t["turns"]}
    assert segment["token_ids"] == [i for s in seqs for i in
                                    turns[s]["prompt_delta_ids"] + turns[s]["completion_ids"]]
    sampled = [i for s in seqs for i in turns[s]["completion_ids"]]
    assert [i for i, m in zip(segment["token_ids"], segment["loss_mask"], strict=True)
            if m] == sampled
    r = bundled_renderer()
    first = r.render_prompt([{"role": "user", "content": f"task of {sid}"}], None).ids
    assert turns[0]["prompt_delta_ids"] == first
    for seq, _, content in answers:  # what the client read is what was sampled
        assert r.decode(turns[seq]["completion_ids"], True).strip() == content.strip()


def test_sessions_stick_to_one_process_and_every_turn_is_recorded_once(fleet):
    proxy, _, _ = fleet
    keys = new_sessions(proxy.url, "stick", 24)
    log: dict = defaultdict(list)
    convs: dict = defaultdict(list)
    run_sessions(proxy.url, keys, 4, log, convs)
    homes = {k: {g for _, g, _ in log[k]} for k in keys}
    assert all(len(h) == 1 for h in homes.values()), homes
    assert len(set().union(*homes.values())) == 2  # both processes serve sessions
    for k in keys:
        assert_recorded_once_token_exact(proxy.url, k, log[k])
    # the /s/{key}/ URL form hashes like the header: same process as the session's turns
    k = "stick-0"
    c = openai.OpenAI(base_url=f"{proxy.url}/s/{keys[k]}/v1", api_key="unused", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(
        model="default", messages=convs[k], max_tokens=6)
    assert raw.headers["x-envhub-gateway"] in homes[k]
    assert raw.parse().model_extra["envhub"]["seqs"] == [4]
    # Anthropic clients send the key as x-api-key: hashed the same way
    claude = anthropic.Anthropic(base_url=proxy.url, api_key=keys[k], max_retries=0)
    raw = claude.messages.with_raw_response.create(
        model="default", max_tokens=6, messages=[{"role": "user", "content": "aside"}])
    assert raw.headers["x-envhub-gateway"] in homes[k]
    assert raw.parse().content


def test_a_stream_through_the_proxy_arrives_as_chunks(fleet):
    proxy, _, ports = fleet
    [key] = new_sessions(proxy.url, "streamer", 1).values()
    msgs = [{"role": "user", "content": "stream please"}]
    via_proxy = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0)
    chunks = list(via_proxy.chat.completions.create(
        model="default", messages=msgs, max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    assert [c.choices[0].delta.role for c in chunks[:1]] == ["assistant"]
    assert [c.choices[0].finish_reason for c in chunks[-2:-1]] == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # the same request straight to a gateway (a retry there is recorded as a fork, and answers
    # the same zero-engine text) streams the same chunks
    direct = openai.OpenAI(base_url=f"http://127.0.0.1:{ports[0]}/v1", api_key=key,
                           max_retries=0)
    again = list(direct.chat.completions.create(
        model="default", messages=msgs, max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    assert len(again) == len(chunks) >= 4
    assert text and text == "".join(c.choices[0].delta.content or "" for c in again if c.choices)
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions",
                      headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "default", "messages": msgs, "max_tokens": 6,
                            "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert "content-length" not in r.headers  # passed through as it comes, not buffered
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 4


def test_a_killed_process_s_sessions_continue_on_the_other(fleet):
    proxy, procs, _ = fleet
    keys = new_sessions(proxy.url, "survive", 16)
    log: dict = defaultdict(list)
    convs: dict = defaultdict(list)
    run_sessions(proxy.url, keys, 3, log, convs)
    homes = {k: log[k][0][1] for k in keys}
    victim_name = homes["survive-0"]
    health = [httpx.get(f"http://127.0.0.1:{p}/health", timeout=10) for p in fleet[2]]
    victim = next(i for i, h in enumerate(health) if h.headers["x-envhub-gateway"] == victim_name)
    os.kill(procs[victim].pid, signal.SIGKILL)
    procs[victim].wait()
    moved = [k for k in keys if homes[k] == victim_name]
    stayed = [k for k in keys if homes[k] != victim_name]
    assert moved and stayed
    run_sessions(proxy.url, keys, 3, log, convs)  # no client retries: nginx fails over
    for k in keys:
        later = {g for _, g, _ in log[k][3:]}
        assert len(later) == 1 and victim_name not in later, (k, log[k])
        assert (later == {homes[k]}) == (k in stayed)  # only the dead process's sessions moved
        assert_recorded_once_token_exact(proxy.url, k, log[k])
