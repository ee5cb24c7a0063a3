"""`envhub gc` and `envhub doctor` on real machines: gc against a Docker engine of the test's
own (a second dockerd with its own data root, so the suite's images and containers running
beside it are out of reach), doctor in a clean container (tests/e2e/test_main_script.py)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import require, require_tool

pytestmark = pytest.mark.docker
ENVHUB = [sys.executable, "-m", "envhub"]


@pytest.fixture
def own_docker() -> Iterator[str]:
    """DOCKER_HOST of a private dockerd, stopped and wiped after. It runs in a network namespace
    of its own (`unshare --net`): a second dockerd in the host's namespace takes the host
    daemon's docker0 bridge down with it, and every container the suite starts beside it."""
    dockerd = require_tool("dockerd")
    unshare = require_tool("unshare")
    require(os.geteuid() == 0, "root, to start a private dockerd")
    root = Path(tempfile.mkdtemp(prefix="dk", dir="/tmp"))  # short: a socket path is <108 bytes
    host = f"unix://{root}/d.sock"
    log = (root / "log").open("w")
    proc = subprocess.Popen([unshare, "--net", dockerd, "--data-root", str(root / "data"),
                             "--exec-root", str(root / "x"), "--pidfile", str(root / "pid"),
                             "--host", host, "--bridge", "none", "--iptables=false"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while docker(host, "info", check=False).returncode != 0:
            assert proc.poll() is None, (root / "log").read_text()[-3000:]
            assert time.monotonic() < deadline, (root / "log").read_text()[-3000:]
            time.sleep(0.5)
        yield host
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def docker(host: str, *args: str, check: bool = True,
           stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    run = subprocess.run(["docker", "-H", host, *args], input=stdin, capture_output=True,
                         timeout=120, check=False)
    assert run.returncode == 0 or not check, run.stderr.decode()
    return run


def image(host: str, tag: str, label: str | None = None) -> None:
    """A one-file image imported as `tag` (optionally with an envhub.base label)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        body = tag.encode()  # a different file per tag: a different image each
        info = tarfile.TarInfo("marker")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    change = ["--change", f"LABEL envhub.base={label}"] if label else []
    docker(host, "import", *change, "-", tag, stdin=data.getvalue())


def container(host: str, image_tag: str, labels: dict[str, str]) -> str:
    flags = [x for k, v in labels.items() for x in ("--label", f"{k}={v}")]
    return docker(host, "create", *flags, image_tag, "/marker").stdout.decode().strip()


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_gc_lists_then_removes_envhub_leftovers_and_nothing_else(own_docker: str,
                                                                 tmp_path: Path) -> None:
    from envhub.envs.images.recipe import default_recipe

    host, current = own_docker, default_recipe().tag
    hostname = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    # images: envhub's leftovers, envhub's current ones, and somebody else's
    image(host, "envhub/agent:0123456789abcdef")
    image(host, "envhub/base:000000000000")
    image(host, current)
    image(host, "envhub/env:0000000000aa", label="envhub/base:000000000000")
    image(host, "envhub/env:0000000000bb")  # no label: built before envhub labelled bases
    image(host, "envhub/env:0000000000cc", label=current)
    image(host, "other/keep:1")
    docker(host, "tag", "other/keep:1", "envhub/agent:fedcba9876543210")  # shared: tag only
    sandbox = {"envhub.sandbox": "1", "envhub.run": "r1"}
    orphan = container(host, "other/keep:1", {**sandbox, "envhub.owner": f"{hostname}:"
                                               f"{dead_pid()}"})
    alive = container(host, "other/keep:1", {**sandbox, "envhub.owner": f"{hostname}:"
                                              f"{os.getpid()}"})
    stranger = container(host, "other/keep:1", {"app": "not-envhub"})
    # files: agent bundles, build caches, runs old and new, local sandbox workdirs
    home, cache, runs, tmp = (tmp_path / d for d in ("home", "cache", "runs", "tmp"))
    (home / "agents" / "pip-abc").mkdir(parents=True)
    (home / "agents" / "pip-abc" / "lib.py").write_text("x" * 1000)
    (cache / "swe-contexts" / "ctx1").mkdir(parents=True)
    for name in ("old", "new", "old-not-a-run"):
        (runs / name).mkdir(parents=True)
    (runs / "old" / "summary.json").write_text("{}")
    (runs / "new" / "summary.json").write_text("{}")
    month_ago = time.time() - 30 * 86400
    for name in ("old", "old-not-a-run"):
        os.utime(runs / name, (month_ago, month_ago))
    stale_dir = tmp / f"envhub-local-r1-p{dead_pid()}-abc"
    live_dir = tmp / f"envhub-local-r2-p{os.getpid()}-abc"
    stale_dir.mkdir(parents=True)
    live_dir.mkdir()
    env = {**os.environ, "DOCKER_HOST": host, "ENVHUB_HOME": str(home),
           "ENVHUB_CACHE": str(cache), "TMPDIR": str(tmp)}
    env.pop("ENVHUB_AGENT_CACHE", None)

    def gc(*flags: str) -> str:
        run = subprocess.run([*ENVHUB, "gc", "--runs", str(runs), "--older-than", "7", *flags],
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    gone_tags = ["envhub/agent:0123456789abcdef", "envhub/base:000000000000",
                 "envhub/env:0000000000aa", "envhub/env:0000000000bb",
                 "envhub/agent:fedcba9876543210"]
    kept_tags = [current, "envhub/env:0000000000cc", "other/keep:1"]
    gone_paths = [home / "agents" / "pip-abc", cache / "swe-contexts" / "ctx1", runs / "old",
                  stale_dir]
    kept_paths = [runs / "new", runs / "old-not-a-run", live_dir]

    listed = gc("--dry-run")
    assert "would remove 10 item(s)" in listed, listed
    for name in [*gone_tags, orphan[:12], *map(str, gone_paths)]:
        assert name in listed, (name, listed)
    for name in [*kept_tags, alive[:12], stranger[:12], *map(str, kept_paths)]:
        assert name not in listed, (name, listed)
    tags = docker(host, "images", "--format", "{{.Repository}}:{{.Tag}}").stdout.decode()
    assert all(t in tags for t in gone_tags + kept_tags)  # a dry run removes nothing
    assert all(p.exists() for p in gone_paths + kept_paths)

    removed = gc()
    assert "removing 10 item(s)" in removed, removed
    tags = docker(host, "images", "--format", "{{.Repository}}:{{.Tag}}").stdout.decode()
    assert not [t for t in gone_tags if t in tags], tags
    assert all(t in tags for t in kept_tags), tags
    containers = docker(host, "ps", "-aq", "--no-trunc").stdout.decode()
    assert orphan not in containers and alive in containers and stranger in containers
    assert not [p for p in gone_paths if p.exists()]
    assert all(p.exists() for p in kept_paths)
    assert "would remove 0 item(s)" in gc("--dry-run")
