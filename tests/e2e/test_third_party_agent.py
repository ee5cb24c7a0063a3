"""A real third-party CLI agent from PyPI (mini-swe-agent), unchanged, run by `envhub run` inside
the rollout's sandbox (local bubblewrap and docker: installed with `--agent-install pip:...`, no
network there) against its gateway session through the sandbox's channel: every model call it
makes is recorded token-exact.

The bundled tiny model answers nonsense, so mini never emits a valid bash tool call and stops by
its own limit (RepeatedFormatError / step limit); what matters is that it ran, went through the
gateway, and that the pool holds its turns with consistent token ids.
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
from tests.support import require, require_docker, require_tool

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


@pytest.mark.parametrize("kind", [pytest.param("local", marks=pytest.mark.bwrap),
                                  pytest.param("docker", marks=pytest.mark.docker)])
def test_mini_swe_agent_runs_unchanged_in_the_sandbox_and_its_turns_are_token_exact(
        tmp_path: Path, kind: str) -> None:
    require_docker() if kind == "docker" else require_tool("bwrap")
    report = tmp_path / "mini_report.py"
    report.write_text(REPORT)
    # `openai/<model>`: litellm's OpenAI provider, whose base URL and key come from the
    # OPENAI_BASE_URL / OPENAI_API_KEY set inside the sandbox (its forwarder to this session).
    # mini's `local` environment: its bash commands run where mini runs, inside the sandbox.
    mini = ("mini --yolo --exit-immediately --model openai/default "
            '--task "$(cat "$ENVHUB_TASK_FILE")" -c mini.yaml -c agent.step_limit=3 '
            "--cost-limit 0 --environment-class local --output /tmp/mini.traj.json")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in MINI_ENV.items())
    script = f"export {exports}; {mini}; mini_report.py /tmp/mini.traj.json $?"
    ran = subprocess.run(
        [sys.executable, "-m", "envhub", "run", "arith",
         "--agent", shlex.join(["sh", "-c", script]),
         *(f"--agent-install={spec}" for spec in mini_requirements()),
         "--agent-install", f"script:{report}",
         "--sandbox", kind, "-n", "1", "-k", "1", "--time-limit", "240", "--out", "out", "-q"],
        cwd=tmp_path, text=True, capture_output=True, timeout=900, check=False)
    assert ran.returncode == 0, ran.stderr
    record = only_rollout(tmp_path / "out")
    assert record["status"] == "done", record
    assert record["agent_info"]["in_sandbox"] == kind
    (line,) = [x for x in record["agent_info"]["stdout_tail"].splitlines()
               if x.startswith("MINI ")]
    saved = json.loads(line[len("MINI "):])
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
