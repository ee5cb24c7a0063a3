"""Recorded runs for the viewer tests: real `envhub run` processes writing run folders."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from envhub.envs.builtin import arith
from tests.envs.runtime_fixtures.gateway import FIXTURES
from tests.support import envhub


@dataclass
class Runs:
    root: Path  # runs/: one folder per run
    arith: Path  # the built-in agent with the bundled model; context actions recorded
    crashy: Path  # one done and one env_failure rollout (oracle)


def arith_with_small_context(dest: Path) -> Path:
    """The built-in arith environment with a context budget its prompts outgrow after a few
    turns (so the agent truncates, recorded as CM actions) and no submit tool (so rollouts
    go on to max_turns rather than stopping at the first submission)."""
    shutil.copytree(Path(arith.__file__).parent, dest,
                    ignore=shutil.ignore_patterns("__pycache__"))
    toml = dest / "envhub.toml"
    text = toml.read_text()
    for old, new in (('tools = ["calculator", "submit"]', 'tools = ["calculator"]'),
                     ("max_turns = 12", "max_turns = 5"),
                     ("context_budget = 2048", "context_budget = 256"),
                     ("max_tokens_per_turn = 256", "max_tokens_per_turn = 48")):
        assert old in text, old
        text = text.replace(old, new)
    toml.write_text(text)
    return dest


@pytest.fixture(scope="session")
def recorded_runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Two real runs: arith (in-process gateway + local engine + bundled model, 2 samples of
    one task, CM actions) and crashy (oracle; one rollout done, one env_failure)."""
    tmp = tmp_path_factory.mktemp("viewer-runs")
    env = arith_with_small_context(tmp / "arith-small")
    root = tmp / "runs"
    # one rollout at a time: the engine draws from one seeded generator, so the same run every
    # time (both sample a calculator call per turn and truncate); concurrent draws interleave
    done = envhub("run", str(env), "-n", "1", "-k", "2", "-c", "1", "--out", str(root / "arith"),
                  "-q",
                  cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    done = envhub("run", str(FIXTURES / "crashy_env"), "--agent", "oracle", "--task", "ok",
                  "--task", "setup-crash", "--model", "zero", "--out", str(root / "crashy"),
                  "-q", cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return Runs(root, root / "arith", root / "crashy")


@dataclass
class Viewer:
    url: str
    proc: subprocess.Popen[bytes]


def start_viewer(source: str, log: Path, *extra: str) -> Viewer:
    """`envhub view SOURCE --port 0` as a user starts it; its URL read from what it prints."""
    with open(log, "wb") as out:  # a file, not a pipe: nobody drains it while pages load
        proc = subprocess.Popen([sys.executable, "-m", "envhub", "view", source, "--port", "0",
                                 *extra], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log.read_text()
        if "envhub view: http://" in text:
            url = text.split("envhub view: ", 1)[1].split()[0].rstrip("/")
            try:
                if httpx.get(url + "/static/view.css", timeout=5).status_code == 200:
                    return Viewer(url, proc)
            except httpx.TransportError:
                pass  # printed before uvicorn listens
        if proc.poll() is not None:
            raise RuntimeError(f"envhub view exited {proc.returncode}: {text}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"envhub view did not start: {log.read_text()}")


@pytest.fixture
def viewer(recorded_runs: Runs, tmp_path: Path) -> Iterator[Viewer]:
    """`envhub view runs/` over both recorded runs."""
    v = start_viewer(str(recorded_runs.root), tmp_path / "view.log")
    yield v
    v.proc.terminate()
    try:
        v.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        v.proc.kill()
        v.proc.wait()
