"""Requests that do not extend the history become context-management actions."""

from __future__ import annotations

import httpx
import openai

from tests.gateway.conftest import CALC_TOOL


def run(gw, key: str, n_turns: int = 4):
    """A tool conversation of n_turns; returns the client and the message list."""
    c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for k in range(n_turns):
        m = c.chat.completions.create(model="default", messages=msgs,
                                      tools=[CALC_TOOL]).choices[0].message
        msgs.append(m.model_dump(exclude_none=True))
        if m.tool_calls:
            msgs += [{"role": "tool", "tool_call_id": t.id, "content": f"r{k}"}
                     for t in m.tool_calls]
        else:
            msgs.append({"role": "user", "content": "more"})
    return c, msgs


def call(c, msgs):
    return c.chat.completions.create(model="default", messages=msgs, tools=[CALC_TOOL])


def traj(gw, key):
    return httpx.get(f"{gw.url}/sessions/{key}/trajectory").json()


def test_truncate_drops_old_observations(gateway):
    c, msgs = run(gateway, "cm-trunc")
    call(c, msgs[:2] + msgs[4:])  # drop the first assistant/tool exchange
    t = traj(gateway, "cm-trunc")
    action = t["cm_actions"][-1]
    assert action["kind"] == "truncate" and action["source"] == "detected"
    assert action["removed"] == [[2, 4]] and action["seq"] == 4
    assert action["tokens_before"] > action["tokens_after"] > 0
    assert len(t["segments"]) == 2 and t["turns"][-1]["segment"] == 1
    assert t["turns"][-1]["prompt_delta_ids"] == t["turns"][-1]["prompt_ids"]


def test_summarize_replaces_messages_with_text(gateway):
    c, msgs = run(gateway, "cm-sum")
    summary = {"role": "user", "content": "Summary: computed 1+1 and 2*3 so far."}
    call(c, msgs[:2] + [summary] + msgs[-1:])
    action = traj(gateway, "cm-sum")["cm_actions"][-1]
    assert action["kind"] == "summarize"
    assert action["added"] == [[2, 4]]  # the summary and the new tool result


def test_rewrite_edits_earlier_content(gateway):
    c, msgs = run(gateway, "cm-edit")
    edited = [dict(m) for m in msgs]
    edited[1]["content"] = "task (edited)"
    call(c, edited)
    t = traj(gateway, "cm-edit")
    assert t["cm_actions"][-1]["kind"] == "rewrite"
    assert len(t["segments"]) == 2


def test_retry_of_last_turn_is_fork(gateway):
    c, msgs = run(gateway, "cm-retry", n_turns=3)
    # the last request again (without the response and what followed it)
    last_request = msgs[:-2] if msgs[-1]["role"] == "tool" else msgs[:-2]
    call(c, last_request)
    t = traj(gateway, "cm-retry")
    action = t["cm_actions"][-1]
    assert action["kind"] == "fork" and action["from_seq"] == 2
    assert t["turns"][-1]["prompt_ids"] == t["turns"][2]["prompt_ids"]
    assert t["turns"][-1]["segment"] != t["turns"][2]["segment"]


def test_branch_from_earlier_turn_is_fork(gateway):
    c, msgs = run(gateway, "cm-branch", n_turns=3)
    call(c, msgs[:4] + [{"role": "user", "content": "different follow-up"}])
    t = traj(gateway, "cm-branch")
    action = t["cm_actions"][-1]
    assert action["kind"] == "fork" and action["from_seq"] == 0
    first = t["turns"][0]
    # the branch continues the sampled ids of turn 0 verbatim
    prefix = first["prompt_ids"] + first["completion_ids"]
    assert t["turns"][-1]["prompt_ids"][:len(prefix)] == prefix


def test_reset_keeps_only_the_system_prompt(gateway):
    c, msgs = run(gateway, "cm-reset", n_turns=2)
    call(c, [msgs[0], {"role": "user", "content": "a brand new problem"}])
    t = traj(gateway, "cm-reset")
    action = t["cm_actions"][-1]
    assert action["kind"] == "reset" and action["from_seq"] == 1
    assert {turn["chain"] for turn in t["turns"]} == {0}  # the same conversation, restarted


def test_unrelated_call_is_a_new_conversation_not_a_reset(gateway):
    """A call sharing nothing with the session (no common first message, nothing kept) opens
    a new chain; no CM action is recorded for it."""
    c, msgs = run(gateway, "cm-unrelated", n_turns=2)
    call(c, [{"role": "user", "content": "a brand new problem"}])
    t = traj(gateway, "cm-unrelated")
    assert t["cm_actions"] == []
    assert [turn["chain"] for turn in t["turns"]] == [0, 0, 2]
    assert [seg["chain"] for seg in t["segments"]] == [0, 2]


def test_declared_action_labels_next_call(gateway):
    from envhub.sdk import Session

    c, msgs = run(gateway, "cm-declared", n_turns=2)
    s = Session(gateway.url, "cm-declared", "cm-declared")
    s.context_action("summarize", info={"strategy": "agent-summary"})
    call(c, msgs[:2] + [{"role": "user", "content": "so far: two steps"}])
    action = traj(gateway, "cm-declared")["cm_actions"][-1]
    assert action["kind"] == "summarize" and action["source"] == "declared"
    assert action["info"]["detected"] in ("summarize", "truncate", "rewrite")


def test_history_survives_restart(tmp_path, tool_script):
    """After a gateway restart, a continuing agent still extends its segment."""
    from tests.gateway.conftest import start

    gw = start(tmp_path, tool_script)
    c, msgs = run(gw, "cm-restart", n_turns=2)
    gw.close()
    gw = start(tmp_path, tool_script)
    try:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="cm-restart", max_retries=0)
        call(c, msgs)
        t = traj(gw, "cm-restart")
        assert len(t["segments"]) == 1 and t["cm_actions"] == []
        assert len(t["turns"]) == 3
    finally:
        gw.close()
