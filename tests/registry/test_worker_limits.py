"""The registry's audit worker bounds the audit's resources: the audit process and everything
it starts run under rlimits (`envhub registry worker --memory-mb --file-mb`), so a package
that allocates past the bound fails its own audit (shown `failed`, the allocation's error in
its owner's report) instead of taking the worker's machine. Sandboxes started under tighter
limits than they would set keep working (they never ask above their parent's hard limit)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.registry.conftest import API, make_env, run_cli, start_server, stop_server
from tests.support import require, require_tool

pytestmark = pytest.mark.bwrap


def audited(tmp_path: Path, name: str, code: str, *flags: str) -> tuple[dict, dict]:
    """(the version's info, its owner's audit report) after a worker run with `flags` audited
    a package whose env.py ends with `code`, published to a fresh registry."""
    server = start_server(tmp_path / "data")
    try:
        env = make_env(tmp_path / name, name=name, version="0.1.0")
        with open(env / "env.py", "a", encoding="utf-8") as f:
            f.write(code)
        out = run_cli("publish", str(env), "--no-audit", "--registry", server.url, "--token",
                      server.tokens["alice"], "--owner", "alice")
        assert out.returncode == 0, out.stderr
        worker = subprocess.run(
            [sys.executable, "-m", "envhub", "registry", "worker", "--data", str(server.data),
             "--once", "--tasks", "1", "--job-timeout", "300", *flags],
            capture_output=True, text=True, timeout=600, check=False)
        assert worker.returncode == 0, worker.stderr[-3000:]
        url = f"{server.url}{API}/packages/alice/{name}/versions/0.1.0"
        info = httpx.get(url, timeout=30).json()
        report = httpx.get(f"{url}/audit", timeout=30, headers={
            "Authorization": f"Bearer {server.tokens['alice']}"}).json()
        return info, report
    finally:
        stop_server(server)


def test_a_package_past_the_memory_bound_fails_its_audit(tmp_path: Path) -> None:
    require_tool("bwrap")
    require(shutil.which("prlimit") is not None, "prlimit (util-linux)")
    # 2 GiB written at import: fine without a bound on this machine, refused under it
    info, report = audited(tmp_path, "hog", "\n_HOG = bytearray(2 << 30)\n"
                           "_HOG[::4096] = b'x' * len(_HOG[::4096])\n", "--memory-mb", "768")
    assert info["verification"]["status"] == "failed", info["verification"]
    assert "MemoryError" in report["output_tail"], json.dumps(report)[:3000]


def test_a_package_filling_the_disk_stops_at_the_bound(tmp_path: Path) -> None:
    """As root, one audit writes into a tmpfs of --disk-mb: a package writing 1 MiB files at
    import gets ENOSPC after at most that much (it prints how much it wrote)."""
    require_tool("bwrap")
    require(os.geteuid() == 0, "root (the disk bound is a tmpfs mount)")
    _, report = audited(tmp_path, "filler", "\nimport os as _os\n_n = 0\ntry:\n"
                        "    while _n < 4096:\n        with open(f'fill-{_n}', 'wb') as _f:\n"
                        "            _f.write(_os.urandom(1 << 20))\n        _n += 1\n"
                        "except OSError as _e:\n    print('FILLED', _n, _e.strerror, flush=True)\n"
                        "    raise\n", "--disk-mb", "64")
    line = next(x for x in report["output_tail"].splitlines() if x.startswith("FILLED"))
    _, written, reason = line.split(" ", 2)
    assert reason == "No space left on device" and int(written) <= 64, line


def test_a_sandbox_under_a_tighter_file_size_limit_still_runs(tmp_path: Path) -> None:
    """The local sandbox sets RLIMIT_FSIZE to 4 GiB; started under a 1 GiB hard limit (as a
    worker with --file-mb 1024 starts it), it keeps 1 GiB rather than failing every command."""
    require_tool("bwrap")
    require(shutil.which("prlimit") is not None, "prlimit (util-linux)")
    env = {**os.environ, "ENVHUB_HOME": str(tmp_path / "home")}
    made = subprocess.run([sys.executable, "-m", "envhub", "init", "tight"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 0, made.stderr
    ran = subprocess.run(["prlimit", f"--fsize={1 << 30}:{1 << 30}", "--",
                          sys.executable, "-m", "envhub", "run", "./tight", "--agent", "oracle",
                          "--sandbox", "local", "-n", "1", "--out", "out", "-q"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    overall = json.loads((tmp_path / "out" / "summary.json").read_text())["overall"]
    assert overall["env_failure"] == 0 and overall["resolved"] == overall["rollouts"] == 1, \
        overall
