"""Agents against a real gateway (scripted completions, real tokenizer and tool-call parsing):
the built-in agent's loop, limits and context management; CLI agents; the agent factory."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from envhub.envs.agents import BoxedCommandAgent, CommandAgent, ToolCallingAgent, make_agent
from envhub.envs.agents.base import AgentContext
from envhub.envs.agents.context import ContextStrategy
from envhub.envs.environment import RunContext
from envhub.envs.errors import AgentError, AgentSpecError
from envhub.envs.loader import load_env
from envhub.envs.manifest import AgentLimits
from envhub.orchestrator.groups.memory_sandbox import MemorySandbox
from envhub.sdk import AsyncSession
from tests.envs.runtime_fixtures.gateway import ADMIN_KEY, FIXTURES, start_gateway, tool_call
from tests.support import ended

AGENT_SCRIPT = str(FIXTURES / "openai_agent.py")


def conversation(n: int) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i in range(n):
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": "calculator", "arguments": f'{{"expression": "{i}+1"}}'}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"{i + 1}"})
    return msgs


def test_drop_strategy_removes_old_exchanges_and_keeps_the_task():
    msgs = conversation(5)
    new, action = ContextStrategy("drop", keep_last=2).fit(msgs, tokens=1000, budget=100)
    assert action is not None and action.kind == "truncate"
    assert action.removed == [[2, 8]] and new == msgs[:2] + msgs[8:]
    assert ContextStrategy("drop").fit(msgs, tokens=50, budget=100) == (msgs, None)


def test_summarize_strategy_replaces_old_exchanges_with_one_message():
    msgs = conversation(4)
    new, action = ContextStrategy("summarize", keep_last=1).fit(msgs, 1000, 100)
    assert action is not None and action.kind == "summarize" and action.added == [[2, 3]]
    assert len(new) == 2 + 1 + 2 and "calculator" in new[2]["content"]
    assert "-> 3" in new[2]["content"]


def test_agent_factory():
    assert isinstance(make_agent(None), ToolCallingAgent)
    assert make_agent("oracle").name == "oracle"
    # a command line runs inside the sandbox unless asked otherwise
    assert isinstance(make_agent(f"{sys.executable} {AGENT_SCRIPT}"), BoxedCommandAgent)
    assert isinstance(make_agent(f"{sys.executable} {AGENT_SCRIPT}", on_host=True),
                      CommandAgent)
    with pytest.raises(AgentSpecError, match="unknown agent"):
        make_agent("orcale")
    with pytest.raises(AgentSpecError, match="not a program on PATH"):
        make_agent("orcale", on_host=True)
    with pytest.raises(AgentSpecError, match="quotes"):
        make_agent("python 'unclosed")
    with pytest.raises(AgentSpecError, match="command-line agents"):
        make_agent("oracle", on_host=True)
    with pytest.raises(AgentSpecError, match="on this machine instead"):
        make_agent("x y", installs=["pip:x"], on_host=True)


async def _context(gw, tmp_path: Path, limits: AgentLimits, task_index: int = 0):
    loaded = load_env("arith")
    task = loaded.env.load_tasks()[task_index]
    session = await AsyncSession.open(gw.url, admin_key=ADMIN_KEY, task_id=task.id, env="arith")
    run = RunContext("test-run", "none", lambda spec: None, tmp_path)  # type: ignore[arg-type]
    ctx = AgentContext(task=task, env=loaded.env, sandbox=MemorySandbox(), run=run,
                       limits=limits, session=session, gateway_url=gw.url)
    return ctx, loaded, task


def test_tool_agent_records_turns_signals_and_declared_context_actions(tmp_path):
    script = [tool_call("calculator", {"expression": f"{i} * 3"}) for i in range(5)]
    script += [tool_call("calculator", {"expression": "import os"}),  # tool error
               tool_call("teleport", {}),  # undeclared: the gateway answers text, records it
               "The answer is 42 因为六乘以七等于四十二",  # no tool call + language mixing
               tool_call("submit", {"answer": "42"})]
    gw, _ = start_gateway(tmp_path, script)
    try:
        async def go():
            limits = AgentLimits(max_turns=20, context_budget=256)
            ctx, loaded, task = await _context(gw, tmp_path, limits)
            result = await ToolCallingAgent(context="summarize").run(ctx)
            traj = await ctx.session.trajectory()
            verdict = await loaded.env.verify(task, ctx.sandbox, ctx.run)
            return result, traj, verdict, task
        result, traj, verdict, task = asyncio.run(go())
    finally:
        gw.close()
    assert result.stopped == "submitted" and result.turns == len(script)
    assert [t.seq for t in traj.turns] == list(range(len(script)))
    signals = {(s.name, s.seq) for s in traj.signals}
    assert {("tool_error", 5), ("undeclared_tool", 6), ("language_mixing", 7)} <= signals
    declared = [a for a in traj.cm_actions if a.source == "declared"]
    assert declared and all(a.kind == "summarize" for a in declared)
    assert result.info["cm_actions"] == len(declared)
    assert verdict.outcome == float(task.data["answer"] == 42)


def test_tool_agent_stops_at_the_turn_limit(tmp_path):
    gw, _ = start_gateway(tmp_path, [tool_call("calculator", {"expression": "1+1"})])
    try:
        async def go():
            ctx, _, _ = await _context(gw, tmp_path, AgentLimits(max_turns=3))
            return await ToolCallingAgent().run(ctx), await ctx.session.trajectory()
        result, traj = asyncio.run(go())
    finally:
        gw.close()
    assert result.stopped == "max_turns" and len(traj.turns) == 3


def test_command_agent_turns_are_recorded_in_its_session(tmp_path):
    gw, _ = start_gateway(tmp_path, ["Hello from the model."])
    try:
        async def go():
            ctx, _, _ = await _context(gw, tmp_path, AgentLimits())
            result = await CommandAgent(f"{sys.executable} {AGENT_SCRIPT}").run(ctx)
            return result, await ctx.session.trajectory()
        result, traj = asyncio.run(go())
    finally:
        gw.close()
    assert result.stopped == "exited" and result.info["exit_code"] == 0
    assert "Hello from the model." in result.info["stdout_tail"]
    assert len(traj.turns) == 2  # the script's two chat calls, recorded in its own session
    assert list(tmp_path.glob("agent-*")) == []  # its working folder is removed


def test_command_agent_failure_is_an_agent_error(tmp_path, monkeypatch):
    gw, _ = start_gateway(tmp_path, ["ok"])
    monkeypatch.setenv("EXIT", "3")
    try:
        async def go():
            ctx, _, _ = await _context(gw, tmp_path, AgentLimits())
            await CommandAgent(f"{sys.executable} {AGENT_SCRIPT}").run(ctx)
        with pytest.raises(AgentError, match="exited with code 3"):
            asyncio.run(go())
    finally:
        gw.close()


def test_command_agent_time_limit_kills_its_whole_process_tree(tmp_path, monkeypatch):
    gw, _ = start_gateway(tmp_path, ["ok"])
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("SPAWN_CHILD", "1")
    monkeypatch.setenv("CHILD_PID_FILE", str(pid_file))
    monkeypatch.setenv("SLEEP", "600")
    try:
        async def go():
            ctx, _, _ = await _context(gw, tmp_path, AgentLimits(time_limit_s=5))
            return await CommandAgent(f"{sys.executable} {AGENT_SCRIPT}").run(ctx)
        result = asyncio.run(go())
    finally:
        gw.close()
    assert result.stopped == "time_limit"
    child = int(pid_file.read_text())
    assert ended(child), "the agent's background child survived"


