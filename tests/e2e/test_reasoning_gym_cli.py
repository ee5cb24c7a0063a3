"""reasoning-gym datasets driven like a user: three `rg:NAME` environments under `envhub run`
with the oracle and with the bundled model (token ids recorded, the scorer's rewards),
`envhub audit` clean on each, and a generated package (`envhub init --from rg:...`) published
with its audit to a registry server on loopback, installed and run from the install."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_browser_envs_model import assert_token_exact
from tests.registry.conftest import start_server, stop_server
from tests.support import envhub, run_leftovers

reasoning_gym = pytest.importorskip("reasoning_gym")  # the reasoning-gym extra (in `all`)

REFS = {"basic_arithmetic": "rg:basic_arithmetic[size=4,seed=5,max_terms=3]",
        "chain_sum": "rg:chain_sum[size=4,seed=5]",
        "leg_counting": "rg:leg_counting[size=4,seed=5,max_animals=4]"}
CONFIG = {"basic_arithmetic": {"max_terms": 3}, "chain_sum": {}, "leg_counting": {"max_animals": 4}}


def rollouts(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "rollouts").glob("*.json"))]


def dataset_of(record: dict) -> str:
    return str(record["env"]).removeprefix("rg-").split("-")[0]


def test_the_oracle_solves_three_datasets(tmp_path):
    ran = envhub("run", *REFS.values(), "--agent", "oracle", "-n", "6", "--out", "out", "-q",
                 cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["resolved"] == summary["overall"]["rollouts"] == 6, summary
    # a non-default config adds a digest to the name: rg-basic_arithmetic-1a2b3c4d
    assert {dataset_of(r) for r in rollouts(tmp_path / "out")} == set(REFS)
    assert {r["env"] for r in rollouts(tmp_path / "out")} >= {"rg-chain_sum"}
    assert all(r["outcome"] == 1.0 for r in rollouts(tmp_path / "out"))
    assert not run_leftovers(summary["run_id"])


@pytest.mark.slow
def test_bundled_model_rollouts_are_recorded_and_scored_by_the_datasets_scorers(tmp_path):
    pytest.importorskip("torch")
    # tool:required: the small bundled model's every reply is a call, so it submits an answer
    # one rollout at a time: the engine's seeded generator gives the same draws every run
    ran = envhub("run", *REFS.values(), "-n", "6", "-c", "1", "--agent", "tool:required",
                 "--max-turns", "2", "--out", "out", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["done"] == 6 and summary["overall"]["env_failure"] == 0, summary
    scored = 0
    for record in rollouts(tmp_path / "out"):
        name = dataset_of(record)
        index = int(record["task_id"].rsplit("-", 1)[1])
        dataset = reasoning_gym.create_dataset(name, seed=5, size=4, **CONFIG[name])
        entry = dataset[index]
        submitted = record["verdict"].get("submitted")
        if submitted is None:
            assert record["outcome"] == 0.0
            continue
        scored += 1
        # the dataset's own score of what the model submitted; the outcome counts a full one
        want = dataset.score_answer(submitted, entry)
        assert record["verdict"]["score"] == pytest.approx(want), record["verdict"]
        assert record["outcome"] == float(want >= 1.0), record["verdict"]
    assert scored >= 3, "the constrained model should submit in most rollouts"
    exported = envhub("export", "--db", f"sqlite:///{tmp_path}/out/pool.db", "--format",
                      "jsonl", "--out", "t.jsonl", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    for row in rows:
        assert_token_exact(row)  # prompt and completion token ids, loss mask, logprobs
        assert all(t["completion_ids"] for t in row["turns"])
        [outcome] = [e for e in row["rewards"] if e["kind"] == "outcome"]
        assert 0.0 <= outcome["value"] <= 1.0
    submits = [c for row in rows for t in row["turns"] for c in t["tool_calls"] or []
               if c["name"] == "submit"]
    assert submits and all("answer" in json.loads(c["arguments"]) for c in submits)


# scorers that eval() (spiral_matrix) or sympy-parse (polynomial_multiplication) the answer
EVALUATING = {"spiral_matrix": "rg:spiral_matrix[size=2]",
              "polynomial_multiplication": "rg:polynomial_multiplication[size=2]"}


@pytest.mark.slow
@pytest.mark.parametrize("name", [*REFS, *EVALUATING])
def test_audit_is_clean_on_rg_datasets(name, tmp_path):
    report = tmp_path / "audit.json"
    proc = envhub("audit", {**REFS, **EVALUATING}[name], "-t", "1", "--out",
                  str(tmp_path / "runs"), "--json", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["cheat"]: r for r in json.loads(report.read_text())["rows"]}
    assert rows["oracle"]["resolved"] == rows["oracle"]["tasks"] == 1
    assert rows["no-op"]["mean_reward"] == 0.0
    assert len(rows) > 3 and all(r["verdict"] == "ok" and r["env_failure"] == 0
                                 and r["agent_error"] == 0 for r in rows.values()), rows
    assert rows["python-code"]["mean_reward"] == 0.0, rows["python-code"]


@pytest.mark.slow
def test_a_generated_package_is_published_installed_and_run(tmp_path):
    server = start_server(tmp_path / "registry-data")
    try:
        env = {"ENVHUB_HOME": str(tmp_path / "home"), "ENVHUB_REGISTRY": server.url,
               "ENVHUB_TOKEN": server.tokens["alice"]}
        made = envhub("init", "legs", "--from", REFS["leg_counting"], cwd=tmp_path, env=env)
        assert made.returncode == 0, made.stderr
        # publish packs the folder and runs `envhub audit` on exactly that package
        published = envhub("publish", "./legs", "--owner", "alice", "--audit-tasks", "1",
                           "--audit-out", str(tmp_path / "audit"), cwd=tmp_path, env=env)
        assert published.returncode == 0, published.stderr[-3000:]
        info = httpx.get(f"{server.url}/api/v1/packages/alice/legs", timeout=30).json()
        [version] = info["versions"]
        assert version["version"] == "0.1.0" and version["audit"]["status"] == "passed"
        installed = envhub("install", "alice/legs@0.1.0", cwd=tmp_path, env=env)
        assert installed.returncode == 0, installed.stderr
        assert "warning" not in installed.stderr  # audited, dependencies satisfied
        ran = envhub("run", "alice/legs@0.1.0", "--agent", "oracle", "-n", "3", "--out", "out",
                     "-q", cwd=tmp_path, env=env)
        assert ran.returncode == 0, ran.stderr[-3000:]
        records = rollouts(tmp_path / "out")
        assert [r["env"] for r in records] == ["legs"] * 3
        assert all(r["outcome"] == 1.0 for r in records)
        expected = reasoning_gym.create_dataset("leg_counting", seed=5, size=4,
                                                **CONFIG["leg_counting"])
        assert [r["verdict"]["expected"] for r in records] == [
            expected[i]["answer"] for i in range(3)]
    finally:
        stop_server(server)
