"""A sandbox's disk is bounded (`[sandbox] disk_mb`, envs/sandbox/disk.py): a command writing
until refused gets ENOSPC at the bound in the workdir, /tmp and /dev/shm alike (one bound for
all three), the three lie on one tmpfs of that size (read from outside the sandbox while
the writer holds its files: the host gives at most that much memory and none of its disk),
and rollouts of such an agent are scored, not env_failure, eight at once, with the gateway
answering throughout."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox
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


def test_eight_disk_filling_rollouts_are_scored_not_env_failure(tmp_path: Path):
    """`--sandbox-disk-mb` bounds every sandbox of the run: eight agents writing until refused
    run at once, end `done` with the environment's own 0 (nothing submitted), and every
    sandbox's disk is gone afterwards."""
    require_tool("bwrap")
    require(os.geteuid() == 0, "root (a local sandbox's disk is a tmpfs mounted for it)")
    agent = ("sh -c 'dd if=/dev/zero of=fill bs=1M count=1024; "
             "dd if=/dev/zero of=/tmp/fill bs=1M count=1024; exit 0'")
    done = envhub("run", "arith", "--agent", agent, "--sandbox", "local", "-n", "4", "-k", "2",
                  "-c", "8", "--sandbox-disk-mb", "32", "--out", str(tmp_path / "run"),
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "run" / "rollouts").glob("*.json")]
    assert len(records) == 8
    assert {r["status"] for r in records} == {"done"}, [r.get("reason") for r in records]
    assert all(r["outcome"] == 0.0 for r in records)
    mounts = Path("/proc/mounts").read_text()
    assert "envhub-sandbox-disk" not in mounts or all(
        str(tmp_path) not in line for line in mounts.splitlines())
