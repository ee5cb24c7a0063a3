"""A sandbox's disk is bounded (`[sandbox] disk_mb`, envs/sandbox/disk.py): a command writing
until refused gets ENOSPC at the bound in the workdir, /tmp and /dev/shm alike (one bound for
all three), the host's disk and memory grow by at most that much (read from outside the
sandbox while the writer holds its files), and rollouts of such an agent are scored, not
env_failure, eight at once, with the gateway answering throughout."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import open_sandbox
from tests.support import envhub, require, require_tool

BOUND_MB = 64
MB = 1 << 20
# 1 GiB into each place, then hold the files while the host looks
# (what it says goes to stdout: the full disk takes no more files)
WRITER = ("for d in /workspace /tmp /dev/shm; do dd if=/dev/zero of=$d/fill bs=1M count=1024 "
          "2>&1 | grep -c 'No space left'; done; du -k /workspace/fill /tmp/fill /dev/shm/fill; "
          "sleep 4")


def shmem() -> int:
    """Bytes of the host's shared memory (tmpfs pages among them), from /proc/meminfo."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


def disk_used() -> int:
    usage = shutil.disk_usage(tempfile.gettempdir())
    return usage.total - usage.free


def test_a_local_sandbox_gets_enospc_at_its_bound_and_the_host_loses_at_most_that():
    require_tool("bwrap")
    require(os.geteuid() == 0, "root (a local sandbox's disk is a tmpfs mounted for it)")

    async def main() -> tuple[int, int, str, str]:
        box = await open_sandbox("local", SandboxSpec(disk_mb=BOUND_MB))
        try:
            memory, disk = shmem(), disk_used()
            peak = [0, 0]

            async def watch() -> None:
                while True:
                    peak[0] = max(peak[0], shmem() - memory)
                    peak[1] = max(peak[1], disk_used() - disk)
                    await asyncio.sleep(0.05)

            watcher = asyncio.create_task(watch())
            result = await box.exec(WRITER, timeout=120)
            watcher.cancel()
            assert result.exit_code == 0, result
        finally:
            await box.close()
        return peak[0], peak[1], result.stdout

    grown_memory, grown_disk, out = asyncio.run(main())
    lines = out.split("\n")
    print(f"host grew: memory {grown_memory / MB:.1f} MiB, disk {grown_disk / MB:.1f} MiB")
    assert lines[:3] == ["1", "1", "1"], out  # each place refused with ENOSPC
    written = sum(int(line.split()[0]) for line in lines[3:6]) * 1024
    assert BOUND_MB * MB * 0.9 <= written <= BOUND_MB * MB, out  # one bound for all three
    # read from outside: 3 GiB were asked for; the other test worker's writes are the slack
    assert grown_memory <= BOUND_MB * MB + 32 * MB, grown_memory
    assert grown_disk <= BOUND_MB * MB, grown_disk


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
