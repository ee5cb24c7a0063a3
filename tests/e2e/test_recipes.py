"""The shipped agent recipes (envs/agents/recipes/*.sh: Claude Code, Codex and opencode from
npm, mini-swe-agent and aider from PyPI), unchanged, each as `--agent NAME.sh --agent-install
recipe:NAME` on arith in a local sandbox with a scripted model, exactly as the docs show them:
the CLI reaches arith's own `submit` over MCP (its own MCP client for the first three; mini's
bash through `envhub-tool`; aider writes ANSWER.txt, which its recipe hands to `submit` with
`envhub-tool`, since aider runs no command unattended), the verifier grades what it submitted
(the right answer 1, a wrong one 0), and every model call is a token-exact turn of its session."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from envhub.envs.agents.install import recipe_names
from envhub.envs.loader import load_env
from tests.e2e.agent_checks import assert_token_exact, only_rollout, pool_trajectory
from tests.support import bundled_renderer, envhub, require, require_tool, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]


def turns(cli: str, answer: str) -> list[str]:
    """The scripted model's replies, in each CLI's own form: hand in `answer`, then stop."""
    if cli in ("claude-code", "codex"):  # both name MCP tools mcp__<server>__<tool>
        return [tool_call("mcp__envhub__submit", {"answer": answer}), "Done."]
    if cli == "opencode":  # <server>_<tool>
        return [tool_call("envhub_submit", {"answer": answer}), "Done."]
    if cli == "mini-swe-agent":  # a thought and one bash call per turn, then mini's own submit
        return [f"THOUGHT: I hand in {answer}.\n\n"
                + tool_call("bash", {"command": f"envhub-tool submit answer={answer}"}),
                "THOUGHT: Done.\n\n"
                + tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]
    assert cli == "aider"  # one reply in its "whole" edit format: the file, then aider exits
    return [f"ANSWER.txt\n```\n{answer}\n```\n"]


def test_every_recipe_is_tested() -> None:
    assert recipe_names() == sorted(["aider", "claude-code", "codex", "mini-swe-agent",
                                     "opencode"])


@pytest.mark.parametrize("right", [True, False], ids=["right", "wrong"])
@pytest.mark.parametrize("cli", ["claude-code", "codex", "opencode", "mini-swe-agent", "aider"])
def test_a_recipe_runs_unchanged_and_its_submitted_answer_is_graded(
        tmp_path: Path, cli: str, right: bool) -> None:
    require(shutil.which("npm") is not None, "node and npm (apt-get install nodejs npm)")
    require_tool("bwrap")
    task = load_env("arith").env.load_tasks()[0]
    answer = str(task.data["answer"] if right else task.data["answer"] + 1)
    script = turns(cli, answer)
    (tmp_path / "turns.json").write_text(json.dumps(script))
    ran = envhub("run", "arith", "-t", task.id, "--agent", f"{cli}.sh",
                 "--agent-install", f"recipe:{cli}", "--sandbox", "local",
                 "--model", "scripted:turns.json", "-n", "1", "-k", "1", "--time-limit", "300",
                 "--out", "out", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    record = only_rollout(tmp_path / "out")
    info = record["agent_info"]
    assert record["status"] == "done", record
    assert "CLI_EXIT 0" in info["stdout_tail"], info["stdout_tail"][-3000:]
    # one call reached arith's own submit over MCP, and the grade is what it submitted
    assert info["tool_calls"] == 1 and info["submitted"] and info["tool_errors"] == 0, info
    assert record["outcome"] == (1.0 if right else 0.0) and record["resolved"] is right
    # every model call is a turn of the session, token-exact, and holds the scripted reply
    traj = pool_trajectory(tmp_path / "out", record["session_id"])
    assert info["refused_requests"] == 0
    assert info["gateway_requests"] == len(traj.turns) == len(script), (info, len(traj.turns))
    assert_token_exact(traj)
    renderer = bundled_renderer()
    ordered = sorted(traj.turns, key=lambda t: t.seq)
    assert [t.completion_ids for t in ordered] == [
        renderer.encode(text) + [renderer.stop_token_ids[0]] for text in script]
    if len(script) > 1:  # the tool's answer went back to the model in the next call
        assert f"submitted {answer}" in renderer.decode(ordered[1].prompt_delta_ids)


def test_an_unknown_recipe_is_exit_2_naming_the_shipped_ones(tmp_path: Path) -> None:
    ran = envhub("run", "arith", "--agent", "x.sh", "--agent-install", "recipe:aidr",
                 "-n", "1", "--out", "out", "-q", cwd=tmp_path)
    assert ran.returncode == 2, ran.stderr
    assert "no such recipe; the shipped ones are aider, claude-code, codex" in ran.stderr
    assert not (tmp_path / "out").exists()
