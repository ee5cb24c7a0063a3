"""A local sandbox's disk: one size-limited filesystem for everything a rollout can write.

As root, a tmpfs of `[sandbox] disk_mb` is mounted beside the workdir (`WORKDIR.disk`); its
`workspace/` is bind-mounted onto the workdir (the host path the file API and the grader
use), and each command's private /tmp and /dev/shm are fresh folders of its `calls/`, removed
when the command ends. So the workspace, /tmp and /dev/shm share the one bound: a write past
it gets ENOSPC inside the sandbox (the agent's problem, scored as usual), and the host gives
the rollout at most `disk_mb` (of memory: tmpfs pages), never its disk.

Without root (no mount), each command's /tmp and /dev/shm are bubblewrap tmpfs mounts of
`disk_mb` each, gone with the command, and the workdir is bounded only per file (the
`--fsize` rlimit): `envhub doctor` says which of the two this machine gives.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".disk"  # the mount beside a workdir
_warned = False


def can_mount() -> bool:
    """Whether this process can give local sandboxes a bounded disk (root and `mount`)."""
    return os.geteuid() == 0 and shutil.which("mount") is not None


class Disk:
    """The mounted bound of one local sandbox (see the module's docstring)."""

    def __init__(self, root: Path, workdir: Path, size_mb: int) -> None:
        self.root, self.workdir, self.size_mb = root, workdir, size_mb

    @classmethod
    def mount(cls, workdir: Path, size_mb: int) -> Disk | None:
        """The bound mounted for `workdir` (an empty folder), or None where this machine cannot
        (not root, or the mount failed: said once in the log)."""
        if not can_mount():
            return None
        root = Path(str(workdir) + SUFFIX)
        try:
            root.mkdir(mode=0o755)
            _run("mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755,nosuid,nodev",
                 "envhub-sandbox-disk", str(root))
            (root / "workspace").mkdir(mode=0o755)
            (root / "calls").mkdir(mode=0o755)
            _run("mount", "--bind", str(root / "workspace"), str(workdir))
        except (OSError, subprocess.CalledProcessError) as e:
            _warn(f"cannot mount a {size_mb} MB disk for local sandboxes ({e}); their "
                  "workdirs are bounded per file only")
            unmount(workdir)
            return None
        return cls(root, workdir, size_mb)

    def call_dir(self) -> Path | None:
        """A fresh folder on the disk for one command's /tmp and /dev/shm (`tmp/`, `shm/`);
        `release` removes it. None when it cannot be made (the command then gets tmpfs mounts
        of the bound's size instead)."""
        folder = self.root / "calls" / uuid.uuid4().hex[:12]
        try:
            for name in ("tmp", "shm"):
                (folder / name).mkdir(parents=True)
                (folder / name).chmod(0o1777)
        except OSError as e:
            log.warning("no scratch folder on the sandbox disk %s: %s", self.root, e)
            self.release(folder)
            return None
        return folder

    @staticmethod
    def release(folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        unmount(self.workdir)


def unmount(workdir: Path) -> None:
    """Undo `Disk.mount` for `workdir` (also for a sandbox whose owner died): the bind, then
    the tmpfs beside it, lazily (a process still inside cannot keep them). Leaves the empty
    mount point folders for the caller's rmtree; never raises."""
    root = Path(str(workdir) + SUFFIX)
    for path in (workdir, root):
        if os.path.ismount(path):
            try:
                _run("umount", "-l", str(path))
            except (OSError, subprocess.CalledProcessError) as e:
                log.warning("cannot unmount %s: %s", path, e)
    try:
        root.rmdir()
    except OSError:
        pass


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def _warn(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(message)
