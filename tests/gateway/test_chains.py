"""Several conversations in one session: a CLI's side calls are chains of their own.

Black-box CLIs make side calls on the same key as their main loop (a title or summary request,
sub-agents). Each conversation is its own chain (a root of the session's tree); CM actions are
reserved for a conversation that rewrites its own history.
"""

from __future__ import annotations

import httpx
import openai

from envhub.sdk.types import Trajectory
from tests.gateway.conftest import CALC_TOOL, start

MAIN_SYSTEM = {"role": "system", "content": "You are a coding agent. Use the calc tool."}
TITLE_SYSTEM = {"role": "system", "content": "Write a five-word title for the user's request."}
TASK = {"role": "user", "content": "Compute 1+1, then 2*3, then report."}


def main_turn(c: openai.OpenAI, msgs: list[dict], k: int) -> None:
    m = c.chat.completions.create(model="default", messages=msgs,
                                  tools=[CALC_TOOL]).choices[0].message
    msgs.append(m.model_dump(exclude_none=True))
    if m.tool_calls:
        msgs += [{"role": "tool", "tool_call_id": t.id, "content": f"r{k}"}
                 for t in m.tool_calls]
    else:
        msgs.append({"role": "user", "content": "go on"})


def side_call(c: openai.OpenAI, msgs: list[dict]) -> None:
    m = c.chat.completions.create(model="default", messages=msgs).choices[0].message
    msgs.append(m.model_dump(exclude_none=True))


def trajectory(gw, key: str) -> Trajectory:
    return Trajectory.model_validate(httpx.get(f"{gw.url}/sessions/{key}/trajectory").json())


def test_side_conversation_interleaved_with_main_is_its_own_chain(tmp_path, tool_script):
    gw = start(tmp_path, tool_script)
    try:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="cli-1", max_retries=0)
        title = [TITLE_SYSTEM, TASK]
        side_call(c, title)  # seq 0: the CLI asks for a title first
        main = [MAIN_SYSTEM, TASK]
        for k in range(3):  # seq 1-3: the main loop
            main_turn(c, main, k)
        title.append({"role": "user", "content": "shorter, please"})
        side_call(c, title)  # seq 4: the side conversation goes on (extends seq 0)
        for k in range(3, 5):  # seq 5-6: the main loop goes on
            main_turn(c, main, k)
        t = trajectory(gw, "cli-1")
        assert [turn.chain for turn in t.turns] == [0, 1, 1, 1, 0, 1, 1]
        assert t.cm_actions == []  # no CM action between the two conversations
        assert len(t.segments) == 2 and {s.chain for s in t.segments} == {0, 1}
        assert t.main_chain() == 1
        # each chain is one token-exact segment: every turn's prompt extends the previous turn
        for chain in (0, 1):
            turns = [turn for turn in t.turns if turn.chain == chain]
            for prev, turn in zip(turns, turns[1:], strict=False):
                assert turn.prompt_ids[:len(prev.prompt_ids) + len(prev.completion_ids)] == (
                    prev.prompt_ids + prev.completion_ids)

        # a real truncation inside the main chain is still one CM action, of the main chain
        truncated = main[:2] + main[4:]
        main_turn(c, truncated, 9)  # seq 7
        t = trajectory(gw, "cli-1")
        assert [a.kind for a in t.cm_actions] == ["truncate"]
        action = t.cm_actions[0]
        assert action.seq == 7 and t.turns[action.from_seq].chain == 1
        assert t.turns[7].chain == 1 and t.turns[7].segment not in (0, 1)
        before = [turn.chain for turn in t.turns]
    finally:
        gw.close()

    # the chains are derived from what is stored: a restarted gateway sees the same ones and
    # a continuing side conversation still joins its chain
    gw = start(tmp_path, tool_script)
    try:
        assert [turn.chain for turn in trajectory(gw, "cli-1").turns] == before
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="cli-1", max_retries=0)
        title.append({"role": "user", "content": "one more"})
        side_call(c, title)
        t = trajectory(gw, "cli-1")
        assert t.turns[-1].chain == 0 and len(t.cm_actions) == 1
    finally:
        gw.close()


def test_sub_agent_with_other_tools_and_prompt_is_a_chain(gateway):
    """A sub-agent call (own system prompt, no shared messages) between main turns."""
    c = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="cli-2", max_retries=0)
    main = [MAIN_SYSTEM, TASK]
    main_turn(c, main, 0)
    sub = [{"role": "system", "content": "You are a search sub-agent."},
           {"role": "user", "content": "find where 2*3 is computed"}]
    main_turn(c, sub, 0)
    main_turn(c, main, 1)
    t = trajectory(gateway, "cli-2")
    assert [turn.chain for turn in t.turns] == [0, 1, 0] and t.cm_actions == []
