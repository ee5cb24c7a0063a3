"""Claude Code and Codex, unchanged, from the npm registry, use an environment's tools over MCP
from inside the rollout's sandbox (issue 29): with the configs envhub writes into the channel
folder (`claude --mcp-config "$ENVHUB_MCP_CONFIG"`; /run/envhub/codex.toml appended to Codex's
config: cli_agents/*_mcp_agent.sh) each lists arith's tools from the forwarder's `/mcp`, offers
them to the model as `mcp__envhub__<tool>` (Codex as a Responses namespace tool), and runs the
call a scripted model makes: the call reaches arith's own `submit`, the verifier grades what it
submitted, and the call and its result are turns of the session in the pool."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from envhub.envs.loader import load_env
from tests.e2e.agent_checks import assert_token_exact, only_rollout, pool_trajectory
from tests.support import bundled_renderer, envhub, require, require_tool, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]

HERE = Path(__file__).with_name("cli_agents")
CLIS = {"claude": "@anthropic-ai/claude-code@2.1.330", "codex": "@openai/codex@0.169.0"}


@pytest.mark.parametrize("cli,right", [("claude", True), ("claude", False), ("codex", True)])
def test_a_cli_agent_submits_through_the_environments_mcp_tool(tmp_path: Path, cli: str,
                                                               right: bool) -> None:
    require(shutil.which("npm") is not None, "node and npm (apt-get install nodejs npm)")
    require_tool("bwrap")
    task = load_env("arith").env.load_tasks()[0]
    answer = str(task.data["answer"] if right else task.data["answer"] + 1)
    # the model's two replies: the MCP tool call as both CLIs offer it, then a final answer
    (tmp_path / "turns.json").write_text(json.dumps([
        tool_call("mcp__envhub__submit", {"answer": answer}), "Done."]))
    script = HERE / f"{cli}_mcp_agent.sh"
    ran = envhub("run", "arith", "-t", task.id, "--agent", script.name,
                 "--agent-install", f"npm:{CLIS[cli]}", "--agent-install", f"script:{script}",
                 "--sandbox", "local", "--model", "scripted:turns.json", "-n", "1", "-k", "1",
                 "--time-limit", "300", "--out", "out", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    record = only_rollout(tmp_path / "out")
    info = record["agent_info"]
    assert record["status"] == "done", record
    assert "CLI_EXIT 0" in info["stdout_tail"], info["stdout_tail"][-3000:]
    # the call reached arith's own submit over MCP, and the grade is what it submitted
    assert info["tool_calls"] == 1 and info["submitted"] and info["tool_errors"] == 0, info
    assert record["outcome"] == (1.0 if right else 0.0) and record["resolved"] is right
    # recorded: the model's call, then its result sent back to the model in the next turn
    traj = pool_trajectory(tmp_path / "out", record["session_id"])
    assert info["refused_requests"] == 0
    assert info["gateway_requests"] == len(traj.turns) == 2, (info, len(traj.turns))
    assert_token_exact(traj)
    assert [c.name for c in traj.turns[0].tool_calls] == ["mcp__envhub__submit"]
    assert f"submitted {answer}" in bundled_renderer().decode(traj.turns[1].prompt_delta_ids)
