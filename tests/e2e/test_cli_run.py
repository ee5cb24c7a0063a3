"""`envhub list | info | run | init` driven like a user: real CLI, real gateway, real sandboxes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from envhub.cli import app
from tests.envs.runtime_fixtures.gateway import ADMIN_KEY, FIXTURES, start_gateway
from tests.support import default_sigint, ended, envhub, require_docker, require_tool, run_leftovers

BAD_MANIFEST = 'name = "bad"\nversion = "one"\nentrypoint = "env:Env"\n'


@pytest.mark.bwrap
@pytest.mark.slow
def test_init_then_run_oracle_resolves_on_embedded_defaults(tmp_path):
    require_tool("bwrap")
    made = envhub("init", "my-env", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "envhub run ./my-env --agent oracle" in made.stdout
    ran = envhub("run", "./my-env", "--agent", "oracle", "--sandbox", "local", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    # without --out the results are kept in runs/<run_id>/, and the run says how to read them
    [out] = (tmp_path / "runs").iterdir()
    summary = json.loads((out / "summary.json").read_text())
    assert out.name == summary["run_id"]
    assert summary["overall"]["resolved"] == 2 and summary["overall"]["env_failure"] == 0
    assert "my-env/hello-file" in ran.stdout  # the results table
    assert (out / "pool.db").is_file()  # the in-process gateway's pool
    assert len(list((out / "rollouts").iterdir())) == 2
    look = f"envhub export --db sqlite:///runs/{out.name}/pool.db --format jsonl"
    assert f"results: runs/{out.name}/" in ran.stdout and look in ran.stdout
    exported = envhub(*look.split()[1:], "--out", "t.jsonl", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert not run_leftovers(summary["run_id"])


@pytest.mark.docker
@pytest.mark.slow
def test_init_then_run_oracle_on_the_default_sandbox_leaves_no_container(tmp_path):
    require_docker()
    import docker

    assert envhub("init", "my-env", cwd=tmp_path).returncode == 0
    ran = envhub("run", "./my-env", "--agent", "oracle", "--out", "out", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["resolved"] == 2
    left = docker.from_env().containers.list(
        all=True, filters={"label": f"envhub.run={summary['run_id']}"})
    assert left == [] and not run_leftovers(summary["run_id"])


@pytest.mark.slow
def test_cli_agent_turns_are_recorded_in_its_session(tmp_path):
    gw, _ = start_gateway(tmp_path, ["Working on it."])
    try:
        agent = f"{sys.executable} {FIXTURES / 'openai_agent.py'}"
        ran = envhub("run", "arith", "-n", "2", "--agent", agent, "--agent-on-host",
                     "--gateway", gw.url,
                     "--admin-key", ADMIN_KEY, "--out", "out", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        assert "WARNING: --agent-on-host" in ran.stderr and "no containment" in ran.stderr
        records = [json.loads(p.read_text()) for p in (tmp_path / "out" / "rollouts").iterdir()]
        assert len(records) == 2
        for record in records:
            assert record["status"] == "done" and record["agent_info"]["exit_code"] == 0
            t = httpx.get(f"{gw.url}/sessions/{record['session_id']}/trajectory",
                          headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
            assert len(t["turns"]) == 2 and t["session"]["task_id"] == record["task_id"]
            assert {e["kind"] for e in t["rewards"]} >= {"outcome", "time", "reward_to_go"}
    finally:
        gw.close()


def test_list_and_info():
    runner = CliRunner()
    listed = runner.invoke(app, ["list", "--json"])
    assert listed.exit_code == 0 and "arith" in {r["name"] for r in json.loads(listed.stdout)}
    info = runner.invoke(app, ["info", "arith", "--json"])
    data = json.loads(info.stdout)
    assert data["task_count"] == 224 and data["tools"] == ["calculator", "submit"]
    assert data["rewards"] == {"outcome": 1.0, "process": 0.1, "time": 0.05}


def path_without(tmp_path: Path, program: str) -> str:
    """A PATH holding every program of this one but `program` (a machine without it)."""
    bin_dir = tmp_path / f"no-{program}-bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for entry in Path(folder).glob("*") if Path(folder).is_dir() else []:
            target = bin_dir / entry.name
            if entry.name != program and not target.exists() and os.access(entry, os.X_OK):
                target.symlink_to(entry)
    return str(bin_dir)


@pytest.mark.parametrize("env,fix", [("swe-task", "apt-get install bubblewrap"),
                                     ("terminal-task", "--sandbox docker"),
                                     ("slides", "apt-get install bubblewrap"),
                                     ("webtask", "apt-get install bubblewrap")])
def test_environments_needing_a_real_sandbox_refuse_the_plain_fallback_up_front(
        tmp_path, env, fix):
    """Without bubblewrap, `local` would be plain processes in a host folder: swe-task (fixed
    paths under /workspace), terminal-task (Dockerfiles) and the browser environments (the
    agent's HTML is rendered only inside a sandbox) refuse it before any rollout, with the fix,
    instead of ending every rollout as env_failure."""
    plain = {**os.environ, "PATH": path_without(tmp_path, "bwrap")}
    ran = subprocess.run([sys.executable, "-m", "envhub", "run", env, "--sandbox", "local",
                          "-n", "1"], cwd=tmp_path, env=plain, text=True, capture_output=True,
                         timeout=120, check=False)
    assert ran.returncode == 2, ran.stderr
    assert fix in ran.stderr and "--sandbox docker" in ran.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was kept


@pytest.mark.slow
def test_the_plain_fallback_runs_environments_that_allow_it(tmp_path):
    """arith needs no sandbox and a scaffolded environment works in a plain host folder: both
    run without bubblewrap (the latter with the loud warning)."""
    plain = {**os.environ, "PATH": path_without(tmp_path, "bwrap")}
    assert envhub("init", "my-env", cwd=tmp_path).returncode == 0
    for env in ("arith", "./my-env"):
        ran = subprocess.run([sys.executable, "-m", "envhub", "run", env, "--agent", "oracle",
                              "--sandbox", "local", "-n", "2", "--out", f"out-{env[-5:]}"],
                             cwd=tmp_path, env=plain, text=True, capture_output=True,
                             timeout=300, check=False)
        assert ran.returncode == 0, ran.stderr
        summary = json.loads((tmp_path / f"out-{env[-5:]}" / "summary.json").read_text())
        assert summary["overall"]["resolved"] == 2, ran.stdout
        assert ("PLAIN SUBPROCESSES" in ran.stderr) == (env != "arith")


@pytest.mark.parametrize("args,message", [
    (["run", "no-such-env"], "available: "),
    (["run", "{bad}"], "field 'version'"),
    (["info", "{bad}"], "field 'version'"),
    (["info", "no-such-env"], "available: "),
    (["run", "arith", "-k", "0"], "-k"),
    (["run", "arith", "-c", "0"], "--concurrency"),
    (["run", "arith", "--sandbox", "vm"], "--sandbox"),
    (["run", "arith", "--resume"], "--out"),
    (["run", "arith", "--agent", "orcale"], "unknown agent"),
    (["run", "arith", "--agent", "a b", "--agent-install", "npm:../x"], "npm package spec"),
    (["run", "arith", "--agent", "oracle", "--agent-install", "pip:x"], "command-line agents"),
    (["run", "arith", "--agent", "a b", "--sandbox", "e2b"], "--agent-on-host"),
    (["run", "arith", "--gateway", "localhost:1"], "URL"),
    (["run", "arith", "--gateway", "http://127.0.0.1:1"], "--admin-key"),
    (["run", "arith=0"], "weight"),
    (["run", "arith", "arith"], "listed twice"),
    (["run", "arith", "--task", "nope"], "no tasks to run"),
    (["init", "Bad Name"], "not a valid environment name"),
    (["run", "arith", "--bogus"], "No such option"),
    (["run"], "Missing argument"),
])
def test_bad_input_exits_2_with_the_fix(tmp_path, monkeypatch, args, message):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "envhub.toml").write_text(BAD_MANIFEST)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENVHUB_ADMIN_KEY", raising=False)
    result = CliRunner().invoke(app, [a.replace("{bad}", str(bad)) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "Bad Name").exists()


def test_failures_are_listed_with_their_reasons(tmp_path):
    gw, _ = start_gateway(tmp_path, ["unused"])
    try:
        result = CliRunner().invoke(app, [
            "run", str(FIXTURES / "crashy_env"), "--agent", "oracle", "--task", "ok",
            "--task", "setup-crash", "--gateway", gw.url, "--admin-key", ADMIN_KEY, "-q"])
    finally:
        gw.close()
    assert result.exit_code == 0, result.output
    assert "1 × env_failure: setup: SandboxError: container exited with code 137" in result.output
    assert "crashy/ok" in result.output


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_leaves_nothing_behind(tmp_path, sig):
    gw, _ = start_gateway(tmp_path, ["Working on it."])
    info_file, pid_file = tmp_path / "info.json", tmp_path / "child.pid"
    env = {**os.environ, "SPAWN_CHILD": "1", "CHILD_PID_FILE": str(pid_file),
           "INFO_FILE": str(info_file), "SLEEP": "600", "TURNS": "1"}
    agent = f"{sys.executable} {FIXTURES / 'openai_agent.py'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub", "run", "arith", "-n", "1", "--agent", agent,
         "--agent-on-host",
         "--gateway", gw.url, "--admin-key", ADMIN_KEY, "-q"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint)
    try:
        for _ in range(600):  # wait (up to ~5 min) until the agent is mid-rollout
            if info_file.exists() or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert info_file.exists(), proc.communicate()
        info = json.loads(info_file.read_text())
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, (out, err)
        assert "interrupted" in err
        assert ended(int(pid_file.read_text()))
        assert not Path(info["cwd"]).exists()  # the agent's folder and the run's scratch
        assert not Path(info["cwd"]).parent.parent.exists()
        t = httpx.get(f"{gw.url}/sessions/{info['session_id']}/trajectory",
                      headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
        assert t["status"] == "env_failure" and t["session"]["reason"] == "interrupted"
    finally:
        if proc.poll() is None:
            proc.kill()
        gw.close()
