"""A real third-party CLI agent from PyPI (mini-swe-agent), unchanged, run by `envhub run` inside
the rollout's sandbox (local bubblewrap and docker: installed with `--agent-install pip:...`, no
network there) against its gateway session through the sandbox's channel: every model call it
makes is recorded token-exact.

The bundled tiny model answers nonsense, so mini never emits a valid bash tool call and stops by
its own limit (RepeatedFormatError / step limit); what matters is that it ran, went through the
gateway, and that the pool holds its turns with consistent token ids.

With a scripted model (`--model scripted:FILE`) that answers in mini's own format (a thought
plus one `bash` tool call per turn: apply swe-task's gold patch, then mini's submit command),
mini's fix is graded and resolves the task, in local and docker sandboxes alike.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.e2e.agent_checks import assert_token_exact, only_rollout, pool_trajectory
from tests.e2e.test_command_agent_grading import gold_fix_command
from tests.support import bundled_renderer, require, require_docker, require_tool, tool_call

pytestmark = [pytest.mark.slow]


# Offline, non-interactive settings taken from mini-swe-agent's own env vars.
MINI_ENV = {
    "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mini-config",  # not ~/.config (nor the workdir)
    "MSWEA_CONFIGURED": "true",  # no first-run setup wizard
    "MSWEA_SILENT_STARTUP": "1",
    # the gateway's model is unknown to litellm's price list: no cost, no crash
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm must not fetch its price list online
    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
}
# Runs next to mini in the sandbox: mini's trajectory file stays there, so what the test needs
# from it (api calls, the usage of each raw response) comes back on stdout.
REPORT = """#!/usr/bin/env python3
import json, sys
saved = json.load(open(sys.argv[1]))
responses = [m["extra"]["response"] for m in saved["messages"]
             if isinstance((m.get("extra") or {}).get("response"), dict)]
info = saved["info"]
usage = [[r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]] for r in responses]
print("MINI " + json.dumps({"exit_code": int(sys.argv[2]), "exit_status": info["exit_status"],
                           "api_calls": info["model_stats"]["api_calls"], "usage": usage}))
"""


def mini_requirements() -> list[str]:
    """mini-swe-agent as installed here, plus `mcp`: this litellm imports it on every completion
    without declaring it (on the host it happens to be installed by another package)."""
    try:
        versions = [metadata.version(p) for p in ("mini-swe-agent", "mcp")]
    except metadata.PackageNotFoundError:
        require(False, "mini-swe-agent (pip install 'mini-swe-agent>=2.4,<3')")
    return [f"pip:mini-swe-agent=={versions[0]}", f"pip:mcp=={versions[1]}"]


def mini_command(*config: str) -> str:
    """mini, unchanged, as a command agent with mini.yaml plus `config` (KEY=VALUE): settings
    from MINI_ENV, its trajectory reported on stdout by REPORT (installed as mini_report.py)."""
    # `openai/<model>`: litellm's OpenAI provider, whose base URL and key come from the
    # OPENAI_BASE_URL / OPENAI_API_KEY set inside the sandbox (its forwarder to this session).
    # mini's `local` environment: its bash commands run where mini runs, inside the sandbox.
    mini = ("mini --yolo --exit-immediately --model openai/default "
            '--task "$(cat "$ENVHUB_TASK_FILE")" -c mini.yaml '
            + "".join(f"-c {shlex.quote(c)} " for c in config)
            + "--cost-limit 0 --environment-class local --output /tmp/mini.traj.json")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in MINI_ENV.items())
    script = f"export {exports}; {mini}; mini_report.py /tmp/mini.traj.json $?"
    return shlex.join(["sh", "-c", script])


def mini_report(record: dict) -> dict:
    """What REPORT printed about mini's own trajectory (exit code, status, calls, usage)."""
    (line,) = [x for x in record["agent_info"]["stdout_tail"].splitlines()
               if x.startswith("MINI ")]
    return json.loads(line[len("MINI "):])


def install_flags(tmp_path: Path) -> list[str]:
    """--agent-install flags: mini-swe-agent from PyPI (as installed here) plus REPORT."""
    report = tmp_path / "mini_report.py"
    report.write_text(REPORT)
    return [*(f"--agent-install={spec}" for spec in mini_requirements()),
            "--agent-install", f"script:{report}"]


@pytest.mark.parametrize("kind", [pytest.param("local", marks=pytest.mark.bwrap),
                                  pytest.param("docker", marks=pytest.mark.docker)])
def test_mini_swe_agent_runs_unchanged_in_the_sandbox_and_its_turns_are_token_exact(
        tmp_path: Path, kind: str) -> None:
    require_docker() if kind == "docker" else require_tool("bwrap")
    ran = subprocess.run(
        [sys.executable, "-m", "envhub", "run", "arith",
         "--agent", mini_command("agent.step_limit=3"), *install_flags(tmp_path),
         "--sandbox", kind, "-n", "1", "-k", "1", "--time-limit", "240", "--out", "out", "-q"],
        cwd=tmp_path, text=True, capture_output=True, timeout=900, check=False)
    assert ran.returncode == 0, ran.stderr
    record = only_rollout(tmp_path / "out")
    assert record["status"] == "done", record
    assert record["agent_info"]["in_sandbox"] == kind
    saved = mini_report(record)
    assert saved["exit_code"] == 0 and saved["exit_status"], saved  # it stopped by itself
    calls = saved["api_calls"]
    assert calls >= 1 and len(saved["usage"]) == calls
    assert record["agent_info"]["gateway_requests"] == calls  # every call through the channel

    traj = pool_trajectory(tmp_path / "out", record["session_id"])
    assert traj.session.task_id == record["task_id"]
    # every call mini made went through its session, none elsewhere
    assert len(traj.turns) == calls
    assert_token_exact(traj)
    # what mini was told per call (usage) is exactly what the pool holds, call by call
    held = [[len(t.prompt_ids), len(t.completion_ids)]
            for t in sorted(traj.turns, key=lambda t: t.seq)]
    assert held == saved["usage"]


# The gold patch in base64 is ~500 tokens, past the gateway's default completion budget (256):
# mini asks for more, as a user of a real model would.
GOLD_CONFIG = ("agent.step_limit=5", "model.model_kwargs.max_tokens=4096")


def gold_fix_script() -> tuple[str, list[str]]:
    """(task id, mini's turns as a model would write them: a thought and one bash tool call
    (the bundled template's Hermes format) applying swe-task's gold patch, then submitting)."""
    task_id, fix = gold_fix_command()
    return task_id, [
        "THOUGHT: I know the fix; I apply it to the repository.\n\n"
        + tool_call("bash", {"command": fix}),
        "THOUGHT: The fix is in place; I submit.\n\n"
        + tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ]


@pytest.mark.parametrize("kind", [pytest.param("local", marks=pytest.mark.bwrap),
                                  pytest.param("docker", marks=pytest.mark.docker)])
def test_mini_swe_agent_applying_the_gold_fix_resolves_swe_task(tmp_path: Path, kind: str) -> None:
    require_docker() if kind == "docker" else require_tool("bwrap")
    task_id, script = gold_fix_script()
    (tmp_path / "script.json").write_text(json.dumps(script))
    ran = subprocess.run(
        [sys.executable, "-m", "envhub", "run", "swe-task", "--agent", mini_command(*GOLD_CONFIG),
         *install_flags(tmp_path), "--model", "scripted:script.json",
         "--sandbox", kind, "-t", task_id, "-n", "1", "-k", "1", "--time-limit", "300",
         "--out", "out", "-q"],
        cwd=tmp_path, text=True, capture_output=True, timeout=900, check=False)
    assert ran.returncode == 0, ran.stderr
    record = only_rollout(tmp_path / "out")
    verdict = record["verdict"]
    assert record["agent_info"]["in_sandbox"] == kind
    saved = mini_report(record)
    # mini ran both scripted turns and stopped by its own submit command
    assert saved["exit_status"] == "Submitted" and saved["api_calls"] == len(script), saved
    assert record["status"] == "done" and record["resolved"], json.dumps(verdict)[:2000]
    assert record["outcome"] == record["components"]["outcome"] == 1.0, record
    assert verdict["patch_bytes"] > 0 and not verdict.get("problems"), verdict

    # the pool holds exactly the scripted calls: one turn each, the scripted text's tokens
    traj = pool_trajectory(tmp_path / "out", record["session_id"])
    assert record["agent_info"]["gateway_requests"] == len(traj.turns) == len(script)
    assert_token_exact(traj)
    renderer = bundled_renderer()
    held = [t.completion_ids for t in sorted(traj.turns, key=lambda t: t.seq)]
    assert held == [renderer.encode(text) + [renderer.stop_token_ids[0]] for text in script]
