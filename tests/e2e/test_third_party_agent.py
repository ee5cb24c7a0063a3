"""A real third-party CLI agent from PyPI (mini-swe-agent), unchanged, run by `envhub run` against
its gateway session on embedded defaults: every model call it makes is recorded token-exact.

The bundled tiny model answers nonsense, so mini never emits a valid bash tool call and stops by
its own limit (RepeatedFormatError / step limit); what matters is that it ran, went through the
gateway, and that the pool holds its turns with consistent token ids.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import require, require_tool

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]


def mini_executable() -> str:
    import importlib.util

    require(importlib.util.find_spec("minisweagent") is not None,
            "mini-swe-agent (pip install 'mini-swe-agent>=2.4,<3')")
    found = shutil.which("mini") or str(Path(sys.executable).parent / "mini")
    assert Path(found).is_file(), "mini-swe-agent is importable but its `mini` script is missing"
    return found


def mini_env(tmp_path: Path) -> dict[str, str]:
    """Offline, non-interactive settings taken from mini-swe-agent's own env vars."""
    return {
        **os.environ,
        "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mini-config"),  # not ~/.config
        "MSWEA_CONFIGURED": "true",  # no first-run setup wizard
        "MSWEA_SILENT_STARTUP": "1",
        # the gateway's model is unknown to litellm's price list: no cost, no crash
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm must not fetch its price list online
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
    }


@pytest.mark.slow
def test_mini_swe_agent_runs_unchanged_and_its_turns_are_token_exact(tmp_path: Path) -> None:
    require_tool("bwrap")
    mini = mini_executable()
    traj_dir = tmp_path / "mini-trajectories"
    traj_dir.mkdir()
    # `openai/<model>`: litellm's OpenAI provider, whose base URL and key come from the
    # OPENAI_BASE_URL / OPENAI_API_KEY the command agent sets to this rollout's session.
    # mini's own bubblewrap environment: should the nonsense model ever emit a well-formed
    # bash call, it runs with the host read-only, not in the test machine's shell.
    agent = (f"{mini} --yolo --exit-immediately --model openai/{{model}} --task {{instruction}} "
             f"-c mini.yaml -c agent.step_limit=3 --cost-limit 0 --environment-class bubblewrap "
             f"--output {traj_dir}/{{task_id}}.traj.json")
    ran = subprocess.run(
        [sys.executable, "-m", "envhub", "run", "arith", "--agent", agent, "--sandbox", "local",
         "-n", "1", "-k", "1", "--time-limit", "240", "--out", "out", "-q"],
        cwd=tmp_path, env=mini_env(tmp_path), text=True, capture_output=True, timeout=540,
        check=False)
    assert ran.returncode == 0, ran.stderr
    records = [json.loads(p.read_text()) for p in (tmp_path / "out" / "rollouts").iterdir()]
    assert len(records) == 1
    record = records[0]
    assert record["status"] == "done", record
    assert record["agent_info"]["exit_code"] == 0, record["agent_info"]

    # mini's own trajectory: how many model calls it made (one assistant message per call)
    saved = json.loads((traj_dir / f"{record['task_id']}.traj.json").read_text())
    assert saved["info"]["exit_status"], saved["info"]  # it stopped by itself, saying why
    calls = saved["info"]["model_stats"]["api_calls"]
    assert calls >= 1
    # the raw model responses mini kept (on assistant messages and on its format-error notes)
    responses = [m["extra"]["response"] for m in saved["messages"]
                 if isinstance((m.get("extra") or {}).get("response"), dict)]
    assert len(responses) == calls

    from envhub.gateway.pool.store import Store
    from envhub.gateway.pool.trajectory import build_trajectory

    store = Store(f"sqlite:///{tmp_path / 'out' / 'pool.db'}")
    try:
        row = store.session_row(record["session_id"])
        assert row is not None
        traj = build_trajectory(store, row)
    finally:
        store.close()
    assert traj.session.task_id == record["task_id"]
    # every call mini made went through its session, none elsewhere
    assert len(traj.turns) == calls
    by_segment: dict[int, list] = {}
    for turn in traj.turns:
        assert turn.prompt_ids and turn.completion_ids, turn.seq
        assert len(turn.completion_logprobs) == len(turn.completion_ids)
        by_segment.setdefault(turn.segment, []).append(turn)
    for turns in by_segment.values():
        turns.sort(key=lambda t: t.seq)
        assert turns[0].prompt_ids == turns[0].prompt_delta_ids
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur.prompt_ids == prev.prompt_ids + prev.completion_ids + cur.prompt_delta_ids
    # what mini was told per call (usage) is exactly what the pool holds, call by call
    told = [(r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]) for r in responses]
    held = [(len(t.prompt_ids), len(t.completion_ids))
            for t in sorted(traj.turns, key=lambda t: t.seq)]
    assert held == told
