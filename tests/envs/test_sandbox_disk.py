"""A sandbox's disk is bounded (`[sandbox] disk_mb`, envs/sandbox/disk.py): a command writing
until refused gets ENOSPC at the bound in the workdir, /tmp and /dev/shm alike (one bound for
all three), the three lie on one tmpfs of that size (read from outside the sandbox while
the writer holds its files: the host gives at most that much memory and none of its disk),
and rollouts of such an agent are scored, not env_failure, eight at once, with the gateway
answering throughout. Docker's bound (`--storage-opt size`) is tested on an engine that can
give it (tests/bounded_docker.py): CI's main engine, overlay2 on ext4, cannot."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox
from tests.bounded_docker import bounding_engine
from tests.support import envhub, require, require_tool

T = TypeVar("T")
BOUND_MB = 64
MB = 1 << 20
PLACES = ("/workspace", "/tmp", "/dev/shm")
HOLD = f"envhub-disk-hold-{os.getpid()}"  # the argv[0] the host finds the writer's process by
# 1 GiB into each place, then hold the files (a sleep named HOLD, until the host ends it)
# while the host looks (what it says goes to stdout: the full disk takes no more files)
WRITER = (f"for d in {' '.join(PLACES)}; do dd if=/dev/zero of=$d/fill bs=1M count=1024 "
          "2>&1 | grep -c 'No space left'; done; du -k /workspace/fill /tmp/fill /dev/shm/fill; "
          f"(exec -a {HOLD} sleep 600) || true")


def holder() -> int | None:
    """The host pid of the writer's holding sleep, once it runs."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[0] == \
                    HOLD.encode():
                return int(entry.name)
        except OSError:
            continue
    return None


async def while_held(box: Sandbox, writer: str, look: Callable[[int], T]) -> tuple[str, T]:
    """Run `writer` in `box`; once its holding sleep runs, `look(pid)` from outside (its host
    pid), then end the hold. (The writer's stdout, what `look` returned.)"""
    running = asyncio.create_task(box.exec(writer, timeout=300))
    pid = None
    while pid is None and not running.done():
        await asyncio.sleep(0.05)
        pid = holder()
    assert pid is not None, await running
    seen = await asyncio.to_thread(look, pid)
    os.kill(pid, signal.SIGTERM)
    result = await running
    assert result.exit_code == 0, result
    return result.stdout, seen


def mounted_at(pid: int, place: str) -> tuple[str, str]:
    """(filesystem type, source) of the mount that holds `place` as process `pid` sees it."""
    best: tuple[int, str, str] = (-1, "", "")
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields, rest = line.split(" - ")[0].split(), line.split(" - ")[1].split()
        point = fields[4]
        if (place == point or place.startswith(point.rstrip("/") + "/")) and len(point) > best[0]:
            best = (len(point), rest[0], rest[1])
    return best[1], best[2]


def test_a_local_sandbox_gets_enospc_at_its_bound_and_the_host_loses_at_most_that():
    """Read from outside the sandbox while the writer holds its files: its workspace, /tmp and
    /dev/shm are one filesystem (one device), a tmpfs (memory, not the host's disk) of at most
    the bound. Looked at this way, what other tests write meanwhile does not count."""
    require_tool("bwrap")
    require(os.geteuid() == 0, "root (a local sandbox's disk is a tmpfs mounted for it)")

    def look(pid: int) -> list[tuple[int, str, str, int]]:
        seen = []
        for place in PLACES:
            inside = f"/proc/{pid}/root{place}"
            fs = os.statvfs(inside)
            seen.append((os.stat(inside).st_dev, *mounted_at(pid, place),
                         fs.f_blocks * fs.f_frsize))
        return seen

    async def main() -> tuple[str, list[tuple[int, str, str, int]]]:
        box = await open_sandbox("local", SandboxSpec(disk_mb=BOUND_MB))
        try:
            return await while_held(box, WRITER, look)
        finally:
            await box.close()

    out, seen = asyncio.run(main())
    lines = out.split("\n")
    assert lines[:3] == ["1", "1", "1"], out  # each place refused with ENOSPC
    written = sum(int(line.split()[0]) for line in lines[3:6]) * 1024
    assert BOUND_MB * MB * 0.9 <= written <= BOUND_MB * MB, out  # one bound for all three
    assert len({device for device, *_ in seen}) == 1, seen  # one filesystem
    assert all(kind == "tmpfs" and size <= BOUND_MB * MB for _, kind, _, size in seen), seen
    assert {source for _, _, source, _ in seen} == {"envhub-sandbox-disk"}, seen


@pytest.fixture(scope="module")
def bounded_docker(tmp_path_factory: pytest.TempPathFactory):
    """DOCKER_HOST of a Docker engine that bounds containers' layers (tests/bounded_docker.py)."""
    with bounding_engine(tmp_path_factory.mktemp("bounded-docker")) as host:
        yield host


REFUSED = "grep -c -e 'No space left' -e 'Disk quota exceeded'"  # ENOSPC or EDQUOT (a quota)
DOCKER_PLACES = ("/workspace", "/tmp", "/root")
DOCKER_WRITER = (f"for d in {' '.join(DOCKER_PLACES)}; do dd if=/dev/zero of=$d/fill bs=1M "
                 f"count=1024 2>&1 | {REFUSED}; done; "
                 "du -k --apparent-size /workspace/fill /tmp/fill /root/fill 2>/dev/null; "
                 f"(exec -a {HOLD} sleep 600) || true")
# run in a process of its own: the sandbox code keeps one engine client per process
DOCKER_PROBE = f"""
import asyncio, json
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import docker as kind, open_sandbox
from tests.envs.test_sandbox_disk import DOCKER_WRITER, while_held

async def main():
    box = await open_sandbox("docker", SandboxSpec(disk_mb={BOUND_MB}))
    try:
        out, [layer] = await while_held(box, DOCKER_WRITER, lambda _: kind.docker_client().api
                                        .containers(all=True, size=True, filters={{"id": box.id}}))
    finally:
        await box.close()
    print(json.dumps([out, int(layer.get("SizeRw") or 0), kind.storage_opt_supported]))

asyncio.run(main())
"""


@pytest.mark.docker
def test_a_docker_sandbox_is_refused_at_its_bound_and_its_layer_holds_at_most_that(
        bounded_docker: str):
    """The writable layer is the docker sandbox's disk (`--storage-opt size`; on btrfs, where a
    quota holds the image's files too, the image's size is added): writing 1 GiB into each of
    three places, the first one takes the bound and the rest are refused; from outside, while
    the files are held, the engine measures the container's layer at most the bound."""
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", DOCKER_PROBE], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "DOCKER_HOST": bounded_docker},
                           cwd=Path(__file__).resolve().parents[2])
    assert probe.returncode == 0, probe.stderr[-3000:]
    out, layer, bounded = json.loads(probe.stdout.splitlines()[-1])
    assert bounded is True, probe.stderr[-3000:]  # the engine took --storage-opt size
    lines = out.split("\n")
    assert lines[:3] == ["1", "1", "1"], out  # each place refused
    written = sum(int(line.split()[0]) for line in lines[3:] if line.strip()) * 1024
    # one bound for all three; on btrfs the image's files count at their allocated size, a few
    # percent above the image's size that storage_size_mb adds: the container gets a little less
    assert BOUND_MB * MB * 0.5 <= written <= BOUND_MB * MB, out
    assert layer <= BOUND_MB * MB, layer  # measured by the engine, from outside


# Fill the disk, then one model call through the rollout's gateway session (bash's /dev/tcp:
# the docker base image has no curl), which must still be answered: its turn is in the pool.
FILLER = r"""dd if=/dev/zero of=fill bs=1M count=1024; dd if=/dev/zero of=/tmp/fill bs=1M count=1024
u=${OPENAI_BASE_URL#http://}; hp=${u%%/*}
body='{"model":"m","messages":[{"role":"user","content":"still there?"}],"max_tokens":4}'
exec 3<>/dev/tcp/${hp%:*}/${hp#*:} || exit 0
printf 'POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n'\
'Content-Type: application/json\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' \
  "$OPENAI_API_KEY" "${#body}" "$body" >&3
head -1 <&3 >&2; exit 0  # the status line, for the record
"""


@pytest.mark.parametrize("kind", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_eight_disk_filling_rollouts_are_scored_not_env_failure(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest):
    """`--sandbox-disk-mb` bounds every sandbox of the run: eight agents writing until refused
    run at once, then each makes a model call, which the gateway answers (its turn is in the
    pool); all end `done` with the environment's own 0 (nothing submitted), and every sandbox's
    disk is gone afterwards."""
    env = {}
    if kind == "local":
        require_tool("bwrap")
        require(os.geteuid() == 0, "root (a local sandbox's disk is a tmpfs mounted for it)")
    else:
        env["DOCKER_HOST"] = request.getfixturevalue("bounded_docker")
    done = envhub("run", "arith", "--agent", shlex.join(["bash", "-c", FILLER]), "--sandbox",
                  kind, "-n", "4", "-k", "2", "-c", "8", "--sandbox-disk-mb", "32",
                  "--out", str(tmp_path / "run"), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "run" / "rollouts").glob("*.json")]
    assert len(records) == 8
    assert {r["status"] for r in records} == {"done"}, [r.get("reason") for r in records]
    assert all(r["outcome"] == 0.0 for r in records)
    refused = ("No space left on device", "Disk quota exceeded")  # ENOSPC, or EDQUOT (a quota)
    assert all(any(r in x["agent_info"]["stderr_tail"] for r in refused) for x in records)
    # each agent's call after its disk filled was answered, and its turn is in the pool
    assert all("HTTP/1.1 200 OK" in r["agent_info"]["stderr_tail"] for r in records), records[0]
    with sqlite3.connect(tmp_path / "run" / "pool.db") as pool:
        turns = dict(pool.execute("SELECT session_id, COUNT(*) FROM turns GROUP BY session_id"))
    assert sorted(turns.get(r["session_id"], 0) for r in records) == [1] * 8, turns
    if kind == "docker":  # every container gone, its layer with it
        listed = subprocess_out(["docker", "ps", "-aq"], {"DOCKER_HOST": env["DOCKER_HOST"]})
        assert listed == "", listed
        return
    mounts = Path("/proc/mounts").read_text()
    assert "envhub-sandbox-disk" not in mounts or all(
        str(tmp_path) not in line for line in mounts.splitlines())


def subprocess_out(argv: list[str], env: dict[str, str]) -> str:
    import subprocess

    return subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()
