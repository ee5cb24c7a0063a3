"""Two gateway processes on one pool, one session moving between them (A, B, A, ...): each
caches the histories it serves, so the one a session comes back to must notice that the other
extended it (pool/leases.py) instead of recording a stale plan or failing with a duplicate key.
Over SQLite and a real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from envhub.gateway.config import GatewayConfig
from envhub.gateway.server import GatewayHandle, run_in_thread
from tests.support import bundled_renderer


def two_gateways(db: str, **config) -> list[GatewayHandle]:
    return [run_in_thread(GatewayConfig(port=0, db=db, backend="zero", **config))
            for _ in range(2)]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def pool_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/pool.db"
    return request.getfixturevalue("postgres_server").create_database()


def lease_lost(gw: GatewayHandle) -> float:
    return gw.app.state.gw.metrics.lease_lost._value.get()


def test_a_session_moving_back_and_forth_is_recorded_once_in_one_segment(pool_url):
    gws = two_gateways(pool_url)
    try:
        clients = [openai.OpenAI(base_url=f"{gw.url}/v1", api_key="mover", max_retries=0)
                   for gw in gws]
        messages: list[dict] = [{"role": "user", "content": "hello"}]
        served, answered = [], []
        for turn, who in enumerate([0, 1, 0, 0, 1, 0]):
            raw = clients[who].chat.completions.with_raw_response.create(
                model="default", messages=messages, max_tokens=4)
            resp = raw.parse()
            served.append(raw.headers["x-envhub-gateway"])
            answered.append(resp.model_extra["envhub"]["seqs"][0])
            messages += [resp.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"turn {turn}"}]
        assert len(set(served)) == 2  # the header names the process that answered
        assert answered == list(range(6))
        # every return to a process found its cached history stale and reloaded it
        assert lease_lost(gws[0]) == 2 and lease_lost(gws[1]) == 1
        t = httpx.get(f"{gws[1].url}/sessions/mover/trajectory").json()
        assert [turn["seq"] for turn in t["turns"]] == list(range(6))
        assert t["cm_actions"] == []
        [segment] = t["segments"]
        assert segment["turn_seqs"] == list(range(6))
        turns = {turn["seq"]: turn for turn in t["turns"]}
        assert segment["token_ids"] == [i for s in range(6) for i in
                                        turns[s]["prompt_delta_ids"] + turns[s]["completion_ids"]]
        first = bundled_renderer().render_prompt([{"role": "user", "content": "hello"}], None)
        assert turns[0]["prompt_delta_ids"] == first.ids
    finally:
        for gw in gws:
            gw.close()


def test_a_session_closed_on_one_process_refuses_turns_on_the_other(pool_url):
    gws = two_gateways(pool_url)
    try:
        serving = openai.OpenAI(base_url=f"{gws[0].url}/v1", api_key="closing", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        serving.chat.completions.create(model="default", messages=msgs, max_tokens=4)
        r = httpx.post(f"{gws[1].url}/sessions/closing/close", json={"status": "done"})
        assert r.status_code == 200, r.text
        with pytest.raises(openai.ConflictError, match="is done"):
            serving.chat.completions.create(model="default", messages=msgs, max_tokens=4)
        t = httpx.get(f"{gws[0].url}/sessions/closing/trajectory").json()
        assert len(t["turns"]) == 1 and t["status"] == "done"
    finally:
        for gw in gws:
            gw.close()


def test_one_new_key_on_two_processes_at_once_opens_one_session(pool_url):
    """Local mode: the first call of a new key reaching both processes together; the one that
    loses the insert race finds the winner's session instead of refusing the key."""
    import asyncio

    gws = two_gateways(pool_url)
    try:
        async def both() -> list:
            clients = [openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="race",
                                          max_retries=0) for gw in gws]
            return await asyncio.gather(*(c.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "x"}], max_tokens=4)
                for c in clients))

        answers = asyncio.run(both())
        assert len(answers) == 2
        t = httpx.get(f"{gws[0].url}/sessions/race/trajectory").json()
        assert sorted(turn["seq"] for turn in t["turns"]) == [0, 1]
    finally:
        for gw in gws:
            gw.close()


@pytest.mark.parametrize("declare_on", [1, 0], ids=["declared-elsewhere", "declared-by-holder"])
def test_a_context_action_declared_on_one_process_labels_the_next_call_on_the_other(
        pool_url, declare_on):
    """The SDK's declaration reaches one process, the agent's next call another (a proxy in
    front): the declaration lives in the pool, so the serving process records it, once."""
    from envhub.sdk import Session

    gws = two_gateways(pool_url)
    key = f"declared-{declare_on}"
    try:
        clients = [openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
                   for gw in gws]
        messages: list[dict] = [{"role": "user", "content": "hello"}]

        def ask(who: int, msgs: list[dict]) -> None:
            resp = clients[who].chat.completions.create(model="default", messages=msgs,
                                                        max_tokens=4)
            msgs += [resp.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": f"turn {len(msgs)}"}]

        ask(0, messages)
        ask(0, messages)  # process 0 holds the session
        Session(gws[declare_on].url, key, key).context_action(
            "summarize", info={"strategy": "agent-summary"})
        summary = [messages[0], {"role": "user", "content": "so far: two steps"}]
        ask(1 - declare_on, summary)
        ask(declare_on, summary)  # used up: not applied again on the first process
        ask(1 - declare_on, summary)
        t = httpx.get(f"{gws[0].url}/sessions/{key}/trajectory").json()
        declared = [a for a in t["cm_actions"] if a["source"] == "declared"]
        assert len(declared) == 1, t["cm_actions"]
        assert declared[0]["kind"] == "summarize" and declared[0]["seq"] == 2
        assert declared[0]["info"]["strategy"] == "agent-summary"
        assert [turn["seq"] for turn in t["turns"]] == list(range(5))
    finally:
        for gw in gws:
            gw.close()
