"""A verifiers environment, written here in verifiers' own format, driven like a user:
`envhub run vf:MODULE` runs their harness against the rollout's gateway session (every model
call recorded token-exact) and scores with their reward functions; `envhub audit` on it is
clean; as a folder package it publishes and runs by reference like any other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import support
from tests.e2e.test_browser_envs_model import assert_token_exact
from tests.envs.test_verifiers_env import CAPITALS, require_verifiers
from tests.support import envhub, run_leftovers

pytestmark = pytest.mark.timeout(900)


def rollouts(out: Path) -> dict[str, dict]:
    return {r["task_id"]: r for r in (json.loads(p.read_text())
                                      for p in (out / "rollouts").glob("*.json"))}


def exported(tmp_path: Path, out: Path) -> list[dict]:
    done = envhub("export", "--db", f"sqlite:///{out}/pool.db", "--format", "jsonl", "--out",
                  "t.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]


def test_their_harness_is_recorded_and_their_rewards_are_the_outcome(tmp_path):
    """A scripted model answers right on `paris`, wrong on `rome`, and a non-number on `count`,
    whose reward function then raises: 1, 0, and 0 with a signal (never env_failure)."""
    require_verifiers()
    (tmp_path / "capitals.py").write_text(CAPITALS)
    (tmp_path / "turns.json").write_text(json.dumps(["Paris", "Milan", "many"]))
    ran = envhub("run", "vf:capitals.py", "--model", "scripted:turns.json", "-n", "3", "-c",
                 "1", "--out", "out", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["agent"] == "vf"  # their harness: the default agent of vf: environments
    by_task = rollouts(tmp_path / "out")
    assert {t: r["outcome"] for t, r in by_task.items()} == {"paris": 1.0, "rome": 0.0,
                                                            "count": 0.0}
    assert all(r["status"] == "done" for r in by_task.values()), by_task
    assert by_task["paris"]["verdict"]["verifiers_rewards"] == {"exact": 1.0}
    assert by_task["rome"]["verdict"]["verifiers_rewards"] == {"exact": 0.0}
    assert "ValueError" in by_task["count"]["verdict"]["ungradable"]
    # the control: the gold answer ("2") passes the same reward, so the raise is the model's
    assert by_task["count"]["verdict"]["control"] == "the task's gold answer passes"
    rows = {row["session"]["task_id"]: row for row in exported(tmp_path, tmp_path / "out")}
    assert set(rows) == {"paris", "rome", "count"}
    for task, row in rows.items():
        assert_token_exact(row)  # the harness's model calls, token ids of the session
        [outcome] = [e for e in row["rewards"] if e["kind"] == "outcome"]
        assert outcome["value"] == by_task[task]["outcome"]
    assert not run_leftovers(summary["run_id"])


@pytest.mark.slow
def test_audit_on_a_verifiers_environment_is_clean(tmp_path):
    """No-op and a hostile reply through their harness score no more than the no-op, nothing
    escapes into env_failure, and the oracle (the reference answer, through the harness)
    solves every task."""
    require_verifiers()
    (tmp_path / "capitals.py").write_text(CAPITALS)
    report = tmp_path / "audit.json"
    proc = envhub("audit", "vf:capitals.py", "-t", "3", "--cheat", "nan-reply",
                  "--out", str(tmp_path / "runs"), "--json", str(report), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["cheat"]: r for r in json.loads(report.read_text())["rows"]}
    assert set(rows) == {"no-op", "oracle", "nan-reply"}
    assert rows["oracle"]["resolved"] == rows["oracle"]["tasks"] == 3
    assert all(r["verdict"] == "ok" and r["env_failure"] == 0 and r["agent_error"] == 0
               for r in rows.values()), rows


@pytest.mark.slow
def test_a_verifiers_package_publishes_and_runs_by_reference(tmp_path):
    require_verifiers()
    pkg, home = tmp_path / "capitals", tmp_path / "home"
    pkg.mkdir()
    (pkg / "capitals.py").write_text(CAPITALS)
    (pkg / "env.py").write_text("from envhub.envs.verifiers import VerifiersEnv as Env\n")
    (pkg / "envhub.toml").write_text(
        'name = "capitals"\nversion = "1.0.0"\nentrypoint = "env:Env"\ntools = []\n'
        'description = "capitals, a verifiers taskset"\n'
        '[sandbox]\nkind = "none"\n[metadata]\nverifiers = "capitals.py"\n')
    env = {"ENVHUB_HOME": str(home), "ENVHUB_REGISTRY": "local"}
    published = support.envhub("publish", "./capitals", "--no-audit", "--owner", "me",
                               cwd=tmp_path, env=env)
    assert published.returncode == 0, published.stderr
    ran = support.envhub("run", "me/capitals@1.0.0", "--agent", "oracle", "-n", "3", "--out",
                         "out", "-q", cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["resolved"] == summary["overall"]["rollouts"] == 3, summary


@pytest.mark.slow
def test_bundled_model_through_their_harness(tmp_path):
    """The bundled model (the embedded engine) answers through verifiers' chat harness: its
    turns are recorded token-exact and the outcome is what their reward function said."""
    pytest.importorskip("torch")
    require_verifiers()
    (tmp_path / "capitals.py").write_text(CAPITALS)
    ran = envhub("run", "vf:capitals.py", "-n", "1", "--out", "out", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    [record] = rollouts(tmp_path / "out").values()
    assert record["status"] == "done", record
    assert record["outcome"] == record["verdict"]["verifiers_reward"] in (0.0, 1.0)
    [row] = exported(tmp_path, tmp_path / "out")
    assert_token_exact(row)


# `finalize` parses the model's answer: a reply that is not a number raises there (TaskError);
# in BROKEN_FINALIZE it raises on every answer, the gold one included.
PARSED = CAPITALS.replace("class CapitalTask(vf.Task[Question, vf.State]):", """
class CapitalTask(vf.Task[Question, vf.State]):
    async def finalize(self, trace, runtime):
        if self.data.id == "count":
            int(trace.last_reply)
""")
BROKEN_FINALIZE = PARSED.replace("            int(trace.last_reply)\n",
                                 "            raise ValueError('broken hook')\n")


def test_a_hook_the_model_breaks_scores_0_and_a_broken_hook_is_env_failure(tmp_path):
    """A task hook raising on the model's reply is 0 with a signal (its gold answer passes);
    one raising on the gold answer too is the environment's failure, not a 0."""
    require_verifiers()
    (tmp_path / "turns.json").write_text(json.dumps(["many"]))
    for name, source, status in (("parsed", PARSED, "done"),
                                 ("broken", BROKEN_FINALIZE, "env_failure")):
        (tmp_path / f"{name}.py").write_text(source)
        ran = envhub("run", f"vf:{name}.py", "--model", "scripted:turns.json", "--task",
                     "count", "--out", name, "-q", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr[-3000:]
        [record] = rollouts(tmp_path / name).values()
        assert record["status"] == status, record
        if status == "done":
            assert record["outcome"] == 0.0 and "TaskError" in record["verdict"]["ungradable"]
        else:
            assert "gold answer fails the same way" in record["reason"], record


def test_an_agent_that_cannot_act_on_a_verifiers_environment_is_refused(tmp_path):
    """`--agent tool` (envhub's tool-calling agent: nothing to call there) is refused before
    anything runs, with the fix, by `run` and `train` alike; a run mixing a verifiers
    environment with another gives each its own agent."""
    require_verifiers()
    (tmp_path / "capitals.py").write_text(CAPITALS)
    for argv in (["run", "vf:capitals.py", "--agent", "tool", "-q"],
                 ["train", "vf:capitals.py", "--agent", "tool", "--steps", "1"]):
        done = envhub(*argv, cwd=tmp_path)
        assert done.returncode == 2, (argv, done.stdout, done.stderr[-3000:])
        assert "drop --agent" in done.stderr, done.stderr[-3000:]
        assert not (tmp_path / "runs").exists()  # refused before anything is written
    (tmp_path / "turns.json").write_text(json.dumps(["Paris"] * 20))
    ran = envhub("run", "vf:capitals.py", "arith", "--model", "scripted:turns.json", "-n", "2",
                 "-c", "1", "--out", "mixed", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "mixed" / "summary.json").read_text())
    assert summary["agent"] == {"capitals": "vf", "arith": "tool"}, summary
    records = [json.loads(p.read_text()) for p in (tmp_path / "mixed" / "rollouts").glob("*")]
    assert {r["env"]: r["status"] for r in records} == {"capitals": "done", "arith": "done"}
