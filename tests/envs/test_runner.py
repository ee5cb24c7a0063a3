"""The runner end to end against a real gateway: groups, rewards in the pool, results folder,
resume, failure mapping (env_failure, never 0), mixed environments, and no leftovers."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from envhub.envs.errors import RunConfigError
from envhub.orchestrator.groups import EnvChoice, RunConfig, run
from tests.envs.runtime_fixtures.gateway import ADMIN_KEY, FIXTURES, start_gateway, tool_call
from tests.support import ended, require_docker, trajectory_json
from tests.support import run_leftovers as leftovers

CRASHY = str(FIXTURES / "crashy_env")


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Runs without `out` keep their results in ./runs/<run_id>/: not in the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def gateway(tmp_path):
    script = [tool_call("calculator", {"expression": "2+2"}),
              tool_call("calculator", {"expression": "1/0"}),
              tool_call("submit", {"answer": "4"})]
    handle, _ = start_gateway(tmp_path, script)
    yield handle
    handle.close()


def config(gw, *envs: str, **kw) -> RunConfig:
    return RunConfig(envs=[EnvChoice.parse(e) for e in envs], gateway=gw.url,
                     admin_key=ADMIN_KEY, **kw)


def trajectory(gw, session_id: str) -> dict:
    return trajectory_json(gw, session_id, ADMIN_KEY)


def test_oracle_groups_resolve_and_every_component_reaches_the_pool(gateway, tmp_path):
    out = tmp_path / "out"
    result = asyncio.run(run(config(gateway, "arith", agent="oracle", n=3, k=2, out=out),
                             progress=False))
    assert len(result.records) == 6
    assert all(r.status == "done" and r.resolved for r in result.records)
    assert len({r.group_id for r in result.records}) == 3
    for r in result.records:
        t = trajectory(gateway, r.session_id)
        assert t["status"] == "done"
        assert {e["kind"] for e in t["rewards"]} == {"outcome", "time"}  # oracle: no turns
        assert [e["value"] for e in t["rewards"] if e["kind"] == "outcome"] == [1.0]
    files = sorted(p.name for p in (out / "rollouts").iterdir())
    assert len(files) == 6 and all(f.startswith("arith__arith-") for f in files)
    record = json.loads((out / "rollouts" / files[0]).read_text())
    assert record["components"]["outcome"] == 1.0 and record["status"] == "done"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["resolved"] == 6 and summary["envs"]["arith"]["done"] == 6
    assert leftovers(result.run_id) == []


def test_tool_agent_rewards_include_process_and_reward_to_go(gateway, tmp_path):
    result = asyncio.run(run(config(gateway, "arith", n=1, k=2, concurrency=1),
                             progress=False))
    for r in result.records:
        assert r.status == "done" and r.turns == 3 and r.stopped == "submitted"
        t = trajectory(gateway, r.session_id)
        kinds = [e["kind"] for e in t["rewards"]]
        assert kinds.count("outcome") == 1 and kinds.count("time") == 1
        assert kinds.count("reward_to_go") == 3  # one per turn
        process = [e for e in t["rewards"] if e["kind"] == "process"]
        assert [(e["name"], e["seq"]) for e in process] == [("tool_error", 1)]
        assert r.components["process"] == -1.0
        assert r.components["total"] == pytest.approx(r.outcome - 0.1 + 0.05 * r.components["time"])


def test_infrastructure_failures_are_env_failure_never_zero(gateway, tmp_path):
    tasks = ["ok", "setup-crash", "sandbox-crash", "grading-failure", "setup-hang"]
    result = asyncio.run(run(config(gateway, CRASHY, agent="oracle", tasks=tasks, k=1,
                                    concurrency=5), progress=False))
    by_task = {r.task_id: r for r in result.records}
    assert by_task["ok"].status == "done" and by_task["ok"].outcome == 1.0
    reasons = {"setup-crash": "exited with code 137", "sandbox-crash": "closed",
               "grading-failure": "grader could not start", "setup-hang": "timed out after 5s"}
    for task_id, reason in reasons.items():
        r = by_task[task_id]
        assert r.status == "env_failure" and reason in (r.reason or ""), r
        assert r.outcome is None and r.components == {} and r.rewards == []
        t = trajectory(gateway, r.session_id)
        assert t["status"] == "env_failure" and t["rewards"] == []  # nothing scored as 0
    assert result.summary["overall"]["env_failure"] == 4
    assert result.summary["overall"]["mean"]["outcome"] == 1.0  # failures are not averaged in


def test_output_the_agent_made_ungradable_scores_zero_and_is_kept(gateway, tmp_path):
    """An answer past the read limit is the agent's doing: the rollout is done with outcome 0
    and a process signal naming it, not an env_failure that training would drop."""
    result = asyncio.run(run(config(gateway, CRASHY, agent="oracle", tasks=["oversized-output"],
                                    k=1), progress=False))
    [r] = result.records
    assert r.status == "done" and r.outcome == 0.0 and not r.resolved, r
    t = trajectory(gateway, r.session_id)
    assert t["status"] == "done"
    assert [e["value"] for e in t["rewards"] if e["kind"] == "outcome"] == [0.0]
    assert any(e["kind"] == "process" and "ungradable_output" in json.dumps(e)
               for e in t["rewards"]), t["rewards"]


def test_resume_skips_finished_rollouts_and_reruns_env_failures(gateway, tmp_path):
    out = tmp_path / "out"
    first = asyncio.run(run(config(gateway, CRASHY, agent="oracle", tasks=["ok", "setup-crash"],
                                   k=2, out=out), progress=False))
    again = asyncio.run(run(config(gateway, CRASHY, agent="oracle",
                                   tasks=["ok", "setup-crash", "grading-failure"], k=2, out=out,
                                   resume=True), progress=False))
    assert again.run_id == first.run_id
    before = {(r.task_id, r.sample): r.session_id for r in first.records}
    after = {(r.task_id, r.sample): r.session_id for r in again.records}
    assert len(after) == 6
    assert after[("ok", 0)] == before[("ok", 0)] and after[("ok", 1)] == before[("ok", 1)]
    assert after[("setup-crash", 0)] != before[("setup-crash", 0)]  # env failures run again
    assert len(list((out / "rollouts").glob("*.json"))) == 6


def test_results_folder_is_not_overwritten_without_resume(gateway, tmp_path):
    out = tmp_path / "out"
    asyncio.run(run(config(gateway, "arith", agent="oracle", n=1, out=out), progress=False))
    with pytest.raises(RunConfigError, match="--resume"):
        asyncio.run(run(config(gateway, "arith", agent="oracle", n=1, out=out), progress=False))
    with pytest.raises(RunConfigError, match="not found"):
        asyncio.run(run(config(gateway, "arith", agent="oracle", out=tmp_path / "new",
                               resume=True), progress=False))


def test_several_environments_share_a_run_by_weight(gateway, tmp_path):
    started = []
    result = asyncio.run(run(config(gateway, "arith=3", f"{CRASHY}=1", agent="oracle", n=4),
                             progress=False, on_start=lambda *a: started.append(a)))
    envs = [r.env for r in result.records]
    assert envs.count("arith") == 3 and envs.count("crashy") == 1
    # no `out`: kept in runs/<run_id>/ all the same, announced before the first rollout
    assert started == [(result.run_id, Path("runs") / result.run_id)]
    assert result.out == Path("runs") / result.run_id
    assert len(list((tmp_path / result.out / "rollouts").iterdir())) == 4
    assert (tmp_path / result.out / "summary.json").is_file()


def test_command_agent_leaves_no_process_or_folder(gateway, tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("SPAWN_CHILD", "1")
    monkeypatch.setenv("CHILD_PID_FILE", str(pid_file))
    agent = f"{sys.executable} {FIXTURES / 'openai_agent.py'}"
    result = asyncio.run(run(config(gateway, "arith", agent=agent, agent_on_host=True, n=1),
                             progress=False))
    (record,) = result.records
    assert record.status == "done" and record.stopped == "exited"
    assert len(trajectory(gateway, record.session_id)["turns"]) == 2
    assert ended(int(pid_file.read_text()))
    assert leftovers(result.run_id) == []


@pytest.mark.docker
def test_killed_container_and_broken_image_are_env_failures_and_nothing_is_left(gateway):
    require_docker()
    import docker

    result = asyncio.run(run(config(gateway, CRASHY, agent="oracle",
                                    tasks=["docker-kill", "bad-image"], sandbox="docker"),
                             progress=False))
    by_task = {r.task_id: r for r in result.records}
    assert by_task["docker-kill"].status == "env_failure", by_task["docker-kill"]
    bad = by_task["bad-image"]
    assert bad.status == "env_failure" and "ImageBuildError" in (bad.reason or ""), bad
    assert all(r.rewards == [] for r in result.records)
    client = docker.from_env()
    left = client.containers.list(all=True, filters={"label": f"envhub.run={result.run_id}"})
    assert left == []
    assert leftovers(result.run_id) == []


def test_model_flag_maps_onto_gateway_config(tmp_path):
    from envhub.orchestrator.groups.gateway_link import model_options

    assert model_options(None) == {}
    assert model_options(str(tmp_path)) == {"model": str(tmp_path)}
    assert model_options("zero") == {"backend": "zero"}
    hosted = model_options("openai/gpt-4.1")
    assert hosted["backend"] == "openai" and hosted["model_name"] == "openai/gpt-4.1"
    with pytest.raises(RunConfigError, match="provider/name"):
        model_options("no-such-model")
    script = tmp_path / "script.json"
    script.write_text('["hello"]')
    assert model_options(f"scripted:{script}") == {"backend": "scripted", "script": str(script)}
    with pytest.raises(RunConfigError, match="no such file"):
        model_options(f"scripted:{tmp_path}/missing.json")


def test_zero_backend_in_process_gateway_runs_the_tool_agent(tmp_path):
    # embedded gateway (no --gateway), zero-work backend: the whole loop without a model
    result = asyncio.run(run(RunConfig(envs=[EnvChoice.parse("arith")], model="zero", n=1, k=2,
                                       max_turns=2, out=tmp_path / "out"), progress=False))
    assert [r.status for r in result.records] == ["done", "done"]
    assert all(r.turns == 2 and r.stopped in ("max_turns", "finished") for r in result.records)
    assert (tmp_path / "out" / "pool.db").is_file() and leftovers(result.run_id) == []


def test_scratch_of_a_killed_run_is_swept_by_the_next_run(gateway):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = Path(tempfile.mkdtemp(prefix="envhub-run-00000000-000000-dead00-"))
    (stale / ".envhub-owner").write_text(f"{socket.gethostname()}:{dead.pid}")
    (stale / "leftover").write_text("x")
    live = Path(tempfile.mkdtemp(prefix="envhub-run-00000000-000000-live00-"))
    (live / ".envhub-owner").write_text(f"{socket.gethostname()}:{os.getpid()}")
    try:
        asyncio.run(run(config(gateway, "arith", agent="oracle", n=1), progress=False))
        assert not stale.exists() and live.exists()
    finally:
        shutil.rmtree(live, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)


def test_agent_failure_is_agent_error_and_not_scored(gateway, monkeypatch):
    monkeypatch.setenv("EXIT", "3")
    agent = f"{sys.executable} {FIXTURES / 'openai_agent.py'}"
    result = asyncio.run(run(config(gateway, "arith", agent=agent, agent_on_host=True, n=1),
                             progress=False))
    (record,) = result.records
    assert record.status == "agent_error" and "exited with code 3" in (record.reason or "")
    t = trajectory(gateway, record.session_id)
    assert t["status"] == "agent_error" and t["rewards"] == [] and len(t["turns"]) == 2


def test_an_environments_own_reward_component_reaches_the_records_and_the_pool(gateway,
                                                                                 tmp_path):
    from tests.envs.conftest import arith_with

    folder = arith_with(tmp_path, 'outcome = 1.0\nbrevity = { weight = 0.5, component = '
                                  '"rewards:Brevity" }')
    result = asyncio.run(run(config(gateway, str(folder), agent="oracle", n=1, k=2),
                             progress=False))
    for record in result.records:
        assert record.status == "done"
        assert "custom" in record.components
        names = [(e["kind"], e["name"], e["weight"]) for e in record.rewards]
        assert ("custom", "brevity", 0.5) in names
        stored = trajectory(gateway, record.session_id)["rewards"]
        assert any(e["name"] == "brevity" for e in stored)
    assert "custom" in result.summary["overall"]["mean"]  # in the summary too


def test_a_time_limit_in_an_environment_limited_by_turns_is_env_failure(tmp_path):
    """arith's limits are in turns and tokens (`time_limit_is_failure`): running out of
    wall-clock time means the machine was too slow, so the rollout is excluded, never scored 0
    (machine load must not decide a CPU demo's rewards)."""
    result = asyncio.run(run(RunConfig(envs=[EnvChoice.parse("arith")], model="zero", n=1, k=2,
                                       time_limit_s=1e-6, out=tmp_path / "out"),
                             progress=False))
    assert [r.status for r in result.records] == ["env_failure", "env_failure"]
    assert all("time limit" in (r.reason or "") and r.outcome is None
               for r in result.records)
    assert result.summary["overall"]["done"] == 0


SELF_CLOSING_AGENT = """
import json, os, urllib.error, urllib.request
root = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
req = urllib.request.Request(
    f"{root}/sessions/{os.environ['ENVHUB_SESSION_ID']}/close", method="POST",
    data=json.dumps({"status": "env_failure", "reason": "not my fault"}).encode(),
    headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "content-type": "application/json"})
try:
    print("close answered", urllib.request.urlopen(req).status)
except urllib.error.HTTPError as e:
    print("close answered", e.code)
"""


def test_an_agent_closing_its_own_session_does_not_decide_its_status(gateway, tmp_path):
    """An agent that holds its session key (here a host process) closes its session as
    env_failure (which training would exclude: a way to hide its failures). The gateway takes a
    close from the admin key only (403), the runner closes with it, and the pool carries the
    runner's verdict, not the agent's."""
    script = tmp_path / "self_close.py"
    script.write_text(SELF_CLOSING_AGENT)
    result = asyncio.run(run(config(gateway, "arith", agent=f"{sys.executable} {script}",
                                    agent_on_host=True, n=1, k=2), progress=False))
    assert [r.status for r in result.records] == ["done", "done"]  # exited 0, graded 0
    for r in result.records:
        assert not r.resolved
        assert "close answered 403" in r.agent_info["stdout_tail"], r.agent_info
        session = trajectory(gateway, r.session_id)["session"]
        assert session["status"] == "done" and session["reason"] != "not my fault"
