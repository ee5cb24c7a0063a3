"""The oracle resolves every shipped swe-task, graded as agents are graded (fresh sandbox,
canaries, the grading wrapper and its runner guard), in both sandbox kinds swe-task runs in:
no grading defence may cost an honest solution its reward."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.envs.loader import load_env
from tests.support import require_docker, require_tool


@pytest.mark.parametrize("kind", [pytest.param("local", marks=pytest.mark.bwrap),
                                  pytest.param("docker", marks=pytest.mark.docker)])
def test_the_oracle_resolves_every_swe_task(tmp_path: Path, kind: str) -> None:
    require_docker() if kind == "docker" else require_tool("bwrap")
    tasks = load_env("swe-task").env.load_tasks()
    ran = subprocess.run([sys.executable, "-m", "envhub", "run", "swe-task", "--agent", "oracle",
                          "--sandbox", kind, "-n", str(len(tasks)), "-k", "1", "--out", "out",
                          "-q"], cwd=tmp_path, text=True, capture_output=True, timeout=1800,
                         check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "out" / "rollouts").iterdir()]
    assert sorted(r["task_id"] for r in records) == sorted(t.id for t in tasks)
    unresolved = {r["task_id"]: (r["status"], r["verdict"].get("problems"), r.get("error"))
                  for r in records if not (r["status"] == "done" and r["resolved"])}
    assert unresolved == {}, json.dumps(unresolved, indent=1)[:4000]
