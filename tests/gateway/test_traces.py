"""The corpus of real clients' request sequences (tests/gateway/traces/*.json, recorded by
traces/record.py): each is replayed against a gateway that samples the completions the client
saw, and must give the chains and CM actions the client really made. A client that
misbehaves becomes a trace here."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support import gateway_in_thread, scripted_backend

TRACES = sorted(Path(__file__).with_name("traces").glob("*.json"))


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_a_recorded_client_replays_to_the_chains_and_actions_it_made(tmp_path, path):
    trace = json.loads(path.read_text())
    expect = trace["expect"]
    assert expect, f"{path.name}: fill `expect` from what the client did"
    engine = scripted_backend(trace["script"])
    gw = gateway_in_thread(tmp_path, engine)
    try:
        with httpx.Client(base_url=gw.url, timeout=60,
                          headers={"authorization": "Bearer trace"}) as c:
            for r in trace["requests"]:
                answer = c.post(r["path"], json=r["body"])
                assert answer.status_code == 200, answer.text
            t = c.get("/sessions/trace/trajectory").json()
    finally:
        gw.close()
    turns = t["turns"]
    assert len(turns) == len(trace["requests"])  # every call is a turn
    # token-exact: the engine received each recorded prompt, and a turn that goes on in its
    # segment is the segment's ids as sampled plus its appended messages only
    assert [ids for _, ids in engine.received] == [turn["prompt_ids"] for turn in turns]
    last: dict[int, dict] = {}
    for turn in turns:
        if (prev := last.get(turn["segment"])) is not None:
            assert turn["prompt_ids"] == (prev["prompt_ids"] + prev["completion_ids"]
                                          + turn["prompt_delta_ids"]), turn["seq"]
        last[turn["segment"]] = turn
    # chains named by the index of their first request
    first = {turn["chain"]: k for k, turn in reversed(list(enumerate(turns)))}
    assert [first[turn["chain"]] for turn in turns] == expect["chains"], turns
    parents = {str(first[turn["chain"]]): first[turn["parent_chain"]]
               for turn in turns if turn["parent_chain"] is not None}
    assert parents == expect.get("side_chains", {}), turns
    by_seq = {turn["seq"]: k for k, turn in enumerate(turns)}
    actions = [[by_seq[a["seq"]], a["kind"]] for a in t["cm_actions"]]
    assert actions == expect["cm_actions"], t["cm_actions"]
    segments = [turn["segment"] for turn in turns]
    assert [segments.index(s) for s in segments] == expect["segments"], turns
    if "finish_reasons" in expect:  # what the client was told
        assert [turn["finish_reason"] for turn in turns] == expect["finish_reasons"], turns
