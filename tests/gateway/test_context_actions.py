"""Requests that do not extend the history become context-management actions."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.conftest import CALC_TOOL
from tests.support import gateway_in_thread, scripted_backend, tool_call


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


@pytest.mark.parametrize("more", [False, True])
def test_the_same_history_without_its_tools_is_a_preamble_change(gateway, more):
    """A framework's final summary call resends the history without the tools (alone, or with
    one more user message): a new segment (the system prompt renders without its tools block)
    recorded as `preamble_change`, nothing removed or added; it used to be a `truncate` that
    removed nothing."""
    key = f"cm-pre-{more}"
    c, msgs = run(gateway, key)
    final = msgs + [{"role": "user", "content": "summarize"}] if more else msgs
    c.chat.completions.create(model="default", messages=final)
    t = traj(gateway, key)
    action = t["cm_actions"][-1]
    assert action["kind"] == "preamble_change" and action["source"] == "detected", action
    assert action["removed"] == [] and action["added"] == []
    assert action["from_seq"] == 3 and action["seq"] == 4
    assert len({turn["chain"] for turn in t["turns"]}) == 1  # the same conversation
    assert t["turns"][-1]["segment"] != t["turns"][-2]["segment"]


def test_a_compaction_asked_for_without_tools_keeps_its_conversation(gateway):
    """Codex CLI's compaction: it asks for the summary with the history and a summary prompt
    and no tools (a `preamble_change`: the chain's tip is now that call, under other tools),
    then resumes with the task, the summary as a user message and the tools again. That is a
    `summarize` of the same chain, matched by the chain's first request; it was a new chain
    with no CM action (matched only against the tip's tools and first request)."""
    key = "cm-codex"
    c, msgs = run(gateway, key)
    summary = c.chat.completions.create(
        model="default", messages=msgs + [{"role": "user", "content": "COMPACT: summarize"}])
    text = summary.choices[0].message.content or ""
    call(c, msgs[:2] + [{"role": "user", "content": f"Another model's summary: {text}"},
                        {"role": "user", "content": "Continue."}])
    t = traj(gateway, key)
    kinds = [(a["kind"], a["seq"], a["from_seq"]) for a in t["cm_actions"]]
    assert kinds == [("preamble_change", 4, 3), ("summarize", 5, 4)], t["cm_actions"]
    assert len({turn["chain"] for turn in t["turns"]}) == 1  # one conversation
    assert len({turn["segment"] for turn in t["turns"]}) == 3


def test_a_summary_the_model_wrote_handed_on_in_a_reordered_request_keeps_its_chain(gateway):
    """Codex CLI's second compaction: the model's summary (the summary call's sampled text)
    goes into a user message and the rest is reordered (the task before the system messages),
    so no sampled response is kept and no opening repeated. The handed-on text ties it to its
    chain: a `summarize` of the chain from the summary call, same chain, new segment (it was
    a new chain with no CM action)."""
    key = "cm-handed"
    c, msgs = run(gateway, key)
    summary = c.chat.completions.create(model="default", messages=msgs + [
        {"role": "user", "content": "COMPACT"}]).choices[0].message.content or ""
    assert len(summary.strip()) >= 16, summary
    call(c, [{"role": "user", "content": "task"}, {"role": "system", "content": "sys"},
             {"role": "user", "content": f"The other model's summary:\n{summary}"},
             {"role": "user", "content": "Continue."}])
    t = traj(gateway, key)
    action = t["cm_actions"][-1]
    assert (action["kind"], action["seq"], action["from_seq"]) == ("summarize", 5, 4), action
    assert len({turn["chain"] for turn in t["turns"]}) == 1
    assert t["turns"][-1]["segment"] not in {turn["segment"] for turn in t["turns"][:-1]}


def test_a_short_answer_repeated_in_another_conversation_does_not_join_it(gateway):
    """Rule 2 needs a handed-on text of some length: an answer as short as "ok" in a new
    conversation's first message is not taken for a summary of the chain that sampled it."""
    key = "cm-short"
    c, msgs = run(gateway, key, n_turns=3)  # the third answer: "The answer is 6."
    c.chat.completions.create(model="default", messages=[
        {"role": "system", "content": "another agent"},
        {"role": "user", "content": "is 6 right? The answer"}])
    t = traj(gateway, key)
    assert t["cm_actions"] == [] and len({turn["chain"] for turn in t["turns"]}) == 2


def test_a_kept_response_moved_behind_a_repeated_block_keeps_its_chain(gateway):
    """aider 0.86: each request resends the sampled reply verbatim but moves its file block and
    its canned reply after the history. difflib lines up the (unchanged) file block and
    canned reply, not the sampled reply, so the reply looked dropped and every call started a
    chain of its own. Kept is decided by the reply's identity: one chain, a CM action."""
    key = "cm-aider"
    c = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    files = {"role": "user", "content": "I added these files to the chat: hello.py ..."}
    canned = {"role": "assistant", "content": "Ok, any changes I propose will be to those files."}
    sys_msg = {"role": "system", "content": "Act as an expert software developer."}
    first = [sys_msg, files, canned, {"role": "user", "content": "add a greeting"}]
    reply = c.chat.completions.create(model="default", messages=first).choices[0].message
    second = [sys_msg, {"role": "user", "content": "add a greeting"},
              reply.model_dump(exclude_none=True), files, canned,
              {"role": "user", "content": "now a farewell"}]
    c.chat.completions.create(model="default", messages=second)
    t = traj(gateway, key)
    assert len({turn["chain"] for turn in t["turns"]}) == 1, t["turns"]
    action, = t["cm_actions"]
    assert action["kind"] == "rewrite" and action["source"] == "detected", action
    # the file block and canned reply (messages 1-2) left their place and were resent after
    assert action["removed"] == [[1, 3]] and action["added"] == [], action
    assert action["info"]["moved"] == [[1, 3]], action


def test_a_truncate_whose_next_tool_result_repeats_a_dropped_one_stays_a_truncate(tmp_path):
    """Tool results repeat ("42" after each call) and their hash carries no call id: the one
    answering the latest call is not the dropped one moved (it was a `summarize` with
    `moved`), it is new."""
    key = "cm-trunc-same"
    gateway = gateway_in_thread(tmp_path, scripted_backend(
        [tool_call("calc", {"expr": "6*7"}), "The answer is 42."]))
    c = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for _ in range(3):
        m = c.chat.completions.create(model="default", messages=msgs,
                                      tools=[CALC_TOOL]).choices[0].message
        msgs.append(m.model_dump(exclude_none=True))
        msgs += ([{"role": "tool", "tool_call_id": t.id, "content": "42"}
                  for t in m.tool_calls or []] or [{"role": "user", "content": "more"}])
    try:
        call(c, msgs[:2] + msgs[4:])
        action = traj(gateway, key)["cm_actions"][-1]
    finally:
        gateway.close()
    assert action["kind"] == "truncate" and action["removed"] == [[2, 4]], action
    assert "moved" not in action["info"], action


MEMORY_TOOL = {"type": "function", "function": {
    "name": "save_memory", "description": "Save a fact.",
    "parameters": {"type": "object", "properties": {"fact": {"type": "string"}},
                   "required": ["fact"]}}}


def test_a_helper_copying_the_history_under_its_own_preamble_is_a_side_chain(gateway):
    """Qwen Code 0.15: beside its main call, a memory extractor with its own system prompt and
    tools copies the main history. It used to be a `rewrite` of the main chain (message 0
    replaced); it is a chain of its own linked to the main one, and the main chain goes on
    untouched, with no CM action."""
    key = "cm-side"
    c, msgs = run(gateway, key, n_turns=2)
    extractor = [{"role": "system", "content": "You extract memories from a conversation."},
                 *msgs[1:]]
    c.chat.completions.create(model="default", messages=extractor, tools=[MEMORY_TOOL])
    call(c, msgs)  # the main loop goes on from its own last turn
    t = traj(gateway, key)
    main, side, after = t["turns"][0], t["turns"][2], t["turns"][3]
    assert t["cm_actions"] == [], t["cm_actions"]
    assert side["chain"] == side["seq"] != main["chain"], t["turns"]
    assert side["parent_chain"] == main["chain"] and main["parent_chain"] is None
    assert after["chain"] == main["chain"] and after["segment"] == main["segment"]


def test_a_changed_system_prompt_alone_is_not_a_side_chain(gateway):
    """The same tools and history under a new system prompt is the chain rewriting message 0."""
    key = "cm-sys"
    c, msgs = run(gateway, key, n_turns=2)
    call(c, [{"role": "system", "content": "sys, now with today's date"}, *msgs[1:]])
    t = traj(gateway, key)
    assert len({turn["chain"] for turn in t["turns"]}) == 1, t["turns"]
    action, = t["cm_actions"]
    assert action["kind"] == "rewrite" and action["removed"] == [[0, 1]], action


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


def test_going_back_to_the_opening_with_a_summary_is_a_summarize(gateway):
    """The conversation keeps its system prompt and task and goes on with a summary in place
    of its turns: a CM action of its own chain (history.py's rule 2)."""
    c, msgs = run(gateway, "cm-opening", n_turns=2)
    call(c, msgs[:2] + [{"role": "user", "content": "So far: computed 1+1."}])
    t = traj(gateway, "cm-opening")
    action = t["cm_actions"][-1]
    assert action["kind"] == "summarize" and action["from_seq"] == 1
    assert {turn["chain"] for turn in t["turns"]} == {0}


def test_a_reset_is_recorded_when_declared_and_is_a_new_conversation_otherwise(gateway):
    """Keeping only the system prompt and going on with a new user message is byte for byte
    what a new conversation of the same agent sends (a second run of a CLI on the key): it
    opens a new chain, no CM action. Declared through the SDK, it is the reset of the
    conversation it left."""
    from envhub.sdk import Session

    c, msgs = run(gateway, "cm-reset", n_turns=2)
    call(c, [msgs[0], {"role": "user", "content": "a brand new problem"}])
    t = traj(gateway, "cm-reset")
    assert t["cm_actions"] == [] and [turn["chain"] for turn in t["turns"]] == [0, 0, 2]

    c, msgs = run(gateway, "cm-reset-declared", n_turns=2)
    Session(gateway.url, "cm-reset-declared", "cm-reset-declared").context_action("reset")
    call(c, [msgs[0], {"role": "user", "content": "a brand new problem"}])
    t = traj(gateway, "cm-reset-declared")
    action = t["cm_actions"][-1]
    assert action["kind"] == "reset" and action["source"] == "declared"
    assert action["from_seq"] == 1 and {turn["chain"] for turn in t["turns"]} == {0}


def test_a_new_conversation_sharing_only_the_first_message_is_not_a_summarize(gateway):
    """[user "Say hi"] then [..., "more please"], then a new conversation [system, user "Say
    hi"] on the same key: a chain of its own (the gateway once recorded it as a summarize of
    the first, judging by the shared message alone)."""
    c = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="cm-hi", max_retries=0)
    hi = [{"role": "user", "content": "Say hi"}]
    reply = c.chat.completions.create(model="default", messages=hi).choices[0].message
    hi += [reply.model_dump(exclude_none=True), {"role": "user", "content": "more please"}]
    c.chat.completions.create(model="default", messages=hi)
    c.chat.completions.create(model="default", messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}])
    t = traj(gateway, "cm-hi")
    assert t["cm_actions"] == [] and [turn["chain"] for turn in t["turns"]] == [0, 0, 2]


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


def test_the_chain_header_starts_a_conversation_of_its_own(gateway):
    """Two runs of one agent on one task send the same first request: without a word from the
    client the second is a retry (fork) of the first; with `X-Envhub-Chain: new` it is a chain
    of its own, no CM action. Any other value is a 400 that says what to send."""
    c, msgs = run(gateway, "cm-header", n_turns=1)
    again = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="cm-header", max_retries=0,
                          default_headers={"X-Envhub-Chain": "new"})
    again.chat.completions.create(model="default", messages=msgs[:2], tools=[CALC_TOOL])
    t = traj(gateway, "cm-header")
    assert t["cm_actions"] == [] and [turn["chain"] for turn in t["turns"]] == [0, 1]
    with pytest.raises(openai.BadRequestError, match="X-Envhub-Chain|x-envhub-chain"):
        c.chat.completions.create(model="default", messages=msgs[:2], tools=[CALC_TOOL],
                                  extra_headers={"X-Envhub-Chain": "old"})
    call(c, msgs[:2])  # the same request again, without the header: a retry
    assert traj(gateway, "cm-header")["cm_actions"][-1]["kind"] == "fork"


def test_a_client_sending_the_chain_header_on_every_call_still_extends_its_turns(gateway):
    """Harnesses set the header once for a whole run (default headers, ANTHROPIC_CUSTOM_
    HEADERS): each run is a chain of its own and its calls extend one another, token-exact."""
    for _ in range(2):  # two runs
        c = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="cm-header-all", max_retries=0,
                          default_headers={"X-Envhub-Chain": "new"})
        msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
        for k in range(2):
            m = call(c, msgs).choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            msgs += ([{"role": "tool", "tool_call_id": t.id, "content": f"r{k}"}
                      for t in m.tool_calls] if m.tool_calls else
                     [{"role": "user", "content": "more"}])
    t = traj(gateway, "cm-header-all")
    assert t["cm_actions"] == [] and [turn["chain"] for turn in t["turns"]] == [0, 0, 2, 2]
    assert [turn["segment"] for turn in t["turns"]] == [0, 0, 1, 1]


def test_a_second_run_with_templated_opening_messages_is_a_new_conversation(gateway):
    """Codex-like first requests: a system prompt, then user messages a CLI sends alike in
    every run (instructions file, environment), then the task. A second run on another task
    keeps all the templated messages, but no response of the first run: a new chain."""
    c = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="cm-templated", max_retries=0)
    opening = [{"role": "system", "content": "sys"},
               {"role": "user", "content": "# AGENTS.md\nBe careful."},
               {"role": "user", "content": "<environment_context>cwd=/repo</environment_context>"}]
    first = opening + [{"role": "user", "content": "task one"}]
    m = call(c, first).choices[0].message
    first.append(m.model_dump(exclude_none=True))
    first += ([{"role": "tool", "tool_call_id": t.id, "content": "r0"} for t in m.tool_calls]
              if m.tool_calls else [{"role": "user", "content": "more"}])
    call(c, first)
    call(c, opening + [{"role": "user", "content": "task two"}])
    t = traj(gateway, "cm-templated")
    assert t["cm_actions"] == [] and [turn["chain"] for turn in t["turns"]] == [0, 0, 2]


def test_a_declaration_taken_by_a_failed_call_applies_to_the_next_one(gateway):
    """The agent declares a summarize, its next call fails (a prompt over the model's limit,
    400): the declaration is not lost with it, nor left to label some later call. The call
    after that carries it."""
    from envhub.sdk import Session

    c, msgs = run(gateway, "cm-declared-retry", n_turns=2)
    Session(gateway.url, "cm-declared-retry", "cm-declared-retry").context_action(
        "summarize", info={"strategy": "agent-summary"})
    with pytest.raises(openai.BadRequestError, match="limit"):
        call(c, msgs[:2] + [{"role": "user", "content": "word " * 50_000}])
    assert traj(gateway, "cm-declared-retry")["cm_actions"] == []
    call(c, msgs[:2] + [{"role": "user", "content": "so far: two steps"}])
    actions = traj(gateway, "cm-declared-retry")["cm_actions"]
    assert [(a["kind"], a["source"]) for a in actions] == [("summarize", "declared")]
