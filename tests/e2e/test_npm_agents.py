"""Codex CLI and Claude Code, unchanged, from the npm registry, as command agents on a swe-task
task inside the rollout's sandbox (`--agent-install npm:...`: node and the packages in the agent
layer or bound read-only), against the run's gateway with the bundled tiny model. It cannot
solve the task; the point is the recording: every model call the CLI made is a turn of its
session (calls == turns), token-exact (TITO on every turn), its compaction recorded as a CM
action, and the model name it asked for kept on each turn.

The packages are installed from the npm registry at test time into the agent cache (then
reused); the CLIs' per-run settings are in cli_agents/*.sh (Codex's on top of its shipped
recipe).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.agent_checks import assert_token_exact, only_rollout, pool_trajectory
from tests.support import envhub, require, require_docker, require_tool

pytestmark = [pytest.mark.slow]

HERE = Path(__file__).with_name("cli_agents")
CLIS = {  # name: (npm spec, agent script, the start of the model names it asks for)
    "codex": ("@openai/codex@0.169.0", "codex_agent.sh", "gpt-5-codex"),
    "claude": ("@anthropic-ai/claude-code@2.1.330", "claude_agent.sh", "claude-"),
}
KINDS = [pytest.param("local", marks=pytest.mark.bwrap),
         pytest.param("docker", marks=pytest.mark.docker)]


def run_cli(tmp_path: Path, cli: str, kind: str, script: str | None = None) -> dict:
    require(shutil.which("npm") is not None, "node and npm (apt-get install nodejs npm)")
    require_docker() if kind == "docker" else require_tool("bwrap")
    spec, default_script, _ = CLIS[cli]
    script = script or default_script
    # Codex's script runs its shipped recipe (codex.sh) first
    recipe = ["--agent-install", "recipe:codex"] if cli == "codex" else []
    ran = envhub("run", "swe-task", "--agent", script, "--agent-install", f"npm:{spec}",
                 *recipe, "--agent-install", f"script:{HERE / script}", "--sandbox", kind,
                 "-n", "1", "-k", "1", "--time-limit", "420", "--out", "out", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    record = only_rollout(tmp_path / "out")
    info = record["agent_info"]
    assert record["status"] == "done", record
    assert info["in_sandbox"] == kind
    exits = [x for x in info["stdout_tail"].splitlines() if x.startswith("CLI_EXIT ")]
    # every invocation of the CLI ran to its end and exited 0
    assert exits and set(exits) == {"CLI_EXIT 0"}, info["stdout_tail"][-3000:]
    return record


def check_recording(tmp_path: Path, record: dict, cli: str) -> None:
    info = record["agent_info"]
    traj = pool_trajectory(tmp_path / "out", record["session_id"])
    # calls == turns: each request the CLI sent through the sandbox's channel is one turn
    assert info["refused_requests"] == 0
    assert info["gateway_requests"] == len(traj.turns) >= 3, (info, len(traj.turns))
    assert_token_exact(traj)
    # the names it asked for are kept (its own defaults: this gateway maps every name)
    assert all((t.requested_model or "").startswith(CLIS[cli][2]) for t in traj.turns)
    # it compacted its own conversation: recorded as a CM action of that chain, whose next turn
    # starts a new segment
    main = traj.main_chain()
    segments = {t.segment for t in traj.turns if t.chain == main}
    actions = [a for a in traj.cm_actions if a.seq is not None]
    assert actions and len(segments) >= 2, traj.cm_actions
    assert {a.kind for a in actions} & {"summarize", "truncate", "rewrite"}, actions
    by_seq = {t.seq: t for t in traj.turns}
    for action in actions:
        assert by_seq[action.seq].segment == action.segment
    if cli == "codex":  # no side calls: its summary calls and every resumed conversation
        # (the summary handed on in a user message, the rest reordered) are one chain
        assert {t.chain for t in traj.turns} == {main}, [(t.seq, t.chain) for t in traj.turns]
        assert {a.kind for a in actions} >= {"preamble_change", "summarize"}, actions


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cli", sorted(CLIS))
def test_npm_cli_agent_runs_unchanged_in_the_sandbox_and_every_call_is_recorded(
        tmp_path: Path, cli: str, kind: str) -> None:
    record = run_cli(tmp_path, cli, kind)
    check_recording(tmp_path, record, cli)


@pytest.mark.bwrap
def test_two_runs_of_claude_code_on_one_key_are_separate_conversations(tmp_path: Path) -> None:
    """A harness runs Claude Code twice on one key, the second run fresh on another task: the
    runs share their system prompt, nothing else. Each run's conversations are chains of their
    own, and no CM action is recorded (the gateway once took the second run for a summarize or
    reset of the first's chains, judging by the first message alone)."""
    record = run_cli(tmp_path, "claude", "local", "claude_two_runs.sh")
    traj = pool_trajectory(tmp_path / "out", record["session_id"])
    assert record["agent_info"]["gateway_requests"] == len(traj.turns) >= 2
    assert_token_exact(traj)
    assert traj.cm_actions == [], traj.cm_actions
    assert len({t.segment for t in traj.turns}) == len({t.chain for t in traj.turns}) >= 2
