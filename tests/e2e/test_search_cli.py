"""The `search` environment driven like a user: `envhub run search` with the oracle and with
the bundled model (its turns constrained to tool calls: the search calls are recorded token
exact), `envhub train search` for three steps and `envhub audit search`."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_browser_envs_model import assert_token_exact
from tests.support import envhub, run_leftovers


def test_run_search_with_the_oracle_solves_every_task(tmp_path):
    ran = envhub("run", "search", "--agent", "oracle", "-n", "4", "--out", "out", "-q",
                 cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["resolved"] == summary["overall"]["rollouts"] == 4, summary
    assert not run_leftovers(summary["run_id"])


@pytest.mark.slow
def test_bundled_model_rollouts_record_search_calls(tmp_path):
    pytest.importorskip("torch")
    # one rollout at a time: the engine's seeded generator gives the same draws every run (two
    # at once interleave theirs, and a sample could submit before any search)
    ran = envhub("run", "search", "-n", "2", "-c", "1", "--agent", "tool:required",
                 "--max-turns", "3", "--out", "out", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["done"] == 2 and summary["overall"]["env_failure"] == 0, summary
    out = envhub("export", "--db", f"sqlite:///{tmp_path}/out/pool.db", "--format", "jsonl",
                 "--out", "t.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    calls = [c for row in rows for t in row["turns"] for c in t["tool_calls"] or []]
    searches = [json.loads(c["arguments"]) for c in calls if c["name"] == "search"]
    assert searches and all(isinstance(s["query"], str) for s in searches), calls
    for row in rows:
        assert_token_exact(row)
        assert [e["kind"] for e in row["rewards"]].count("outcome") == 1


@pytest.mark.slow
def test_train_search_runs_three_steps(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "run"
    done = envhub("train", "search", "--steps", "3", "--seed", "3", "--out", str(out),
                  "--groups", "2", "--k", "2", "--tasks", "2", "--max-turns", "3",
                  "--sync", "--eval-every", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["rollouts"] == 4 and r["env_failures"] == 0 and r["groups_trained"] >= 1
        assert r["mix/search/launched_groups"] == 2 * (r["step"] + 1)
        assert r["trainer/tokens/packed"] > 0 or r["trainer/step/skipped"] == 1, r
        # unconstrained sampling: the trainer recomputes the engine's logprobs exactly
        assert r["trainer/kl/rollout_train_k1"] == pytest.approx(0.0, abs=1e-3), r


@pytest.mark.slow
def test_audit_on_search_is_clean(tmp_path):
    """The generic battery (hostile answers and tool arguments through the built-in agent)
    beats no no-op and escapes into no env_failure; the oracle solves its tasks."""
    report = tmp_path / "audit.json"
    proc = envhub("audit", "search", "-t", "1", "--out", str(tmp_path / "runs"), "--json",
                  str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["cheat"]: r for r in json.loads(report.read_text())["rows"]}
    assert rows["oracle"]["resolved"] == rows["oracle"]["tasks"] == 1
    assert len(rows) > 3 and all(r["verdict"] == "ok" and r["env_failure"] == 0
                                 and r["agent_error"] == 0 for r in rows.values()), rows
