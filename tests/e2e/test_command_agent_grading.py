"""A command agent that makes the gold fix is graded on it, in every sandbox kind swe-task runs
in. With `--sandbox local` the agent's channel folder, removed when the agent phase ends, stayed
bound into the sandbox: every grading command failed in bwrap ("Can't find source path"), the
changes read as empty and an honest fix scored 0 with status done."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.envs.loader import load_env
from tests.e2e.agent_checks import only_rollout
from tests.support import require_docker, require_tool


def gold_fix_command() -> tuple[str, str]:
    """(task id, a shell command applying that swe-task's gold patch in its repository)."""
    env = load_env("swe-task").env
    task = env.load_tasks()[0]
    swe = env.swe_task(task)  # type: ignore[attr-defined]
    patch = base64.b64encode(swe.patch.encode()).decode()
    repo = shlex.quote(swe.repo_dir)
    return task.id, (f"echo {patch} | base64 -d | git -C {repo} apply - && "
                     f"git -C {repo} diff --stat")


def gold_fix_agent() -> tuple[str, str]:
    """(task id, a command agent applying that task's gold patch in its repository)."""
    task_id, script = gold_fix_command()
    return task_id, shlex.join(["sh", "-c", script])


@pytest.mark.parametrize("kind", [pytest.param("local", marks=pytest.mark.bwrap),
                                  pytest.param("docker", marks=pytest.mark.docker)])
def test_a_command_agents_gold_fix_resolves_the_task(tmp_path: Path, kind: str) -> None:
    require_docker() if kind == "docker" else require_tool("bwrap")
    task_id, agent = gold_fix_agent()
    ran = subprocess.run([sys.executable, "-m", "envhub", "run", "swe-task", "--agent", agent,
                          "--sandbox", kind, "-t", task_id, "-n", "1", "-k", "1",
                          "--out", "out", "-q"],
                         cwd=tmp_path, text=True, capture_output=True, timeout=900, check=False)
    assert ran.returncode == 0, ran.stderr
    record = only_rollout(tmp_path / "out")
    verdict = record["verdict"]
    assert record["status"] == "done" and record["resolved"], json.dumps(verdict)[:2000]
    assert verdict["patch_bytes"] > 0 and not verdict.get("problems"), verdict
