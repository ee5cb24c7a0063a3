"""Ending a container's processes from the host, through its cgroup's freezer.

The docker sandbox ends every process a finished call left behind. A sweep from inside (docker
exec of a fork-free shell loop) cannot start when a fork bomb holds every pid of the
container's limit, and is starved when it can (it shares the container's CPU quota with the
bomb); killing the container through the engine can hang on a loaded host. The kernel needs
none of these: freeze the container's cgroup (no process runs, so none forks), SIGKILL every
process in it but the ones to keep, thaw (the killed ones die before running another
instruction). Works with cgroup v2 (`cgroup.freeze`) and v1 (`freezer.state`), with the
cgroupfs or systemd driver: the cgroup is found from the container's main pid
(`/proc/PID/cgroup` and this host's cgroup mounts) and used only when its path names the
container (a remote engine's pid means nothing here). Needs write access to the cgroup (root
on the engine's host); `find_freezer` returns None otherwise.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FREEZE_WAIT_S = 5.0  # a task in uninterruptible sleep may delay the freeze; kill anyway after


@dataclass(frozen=True)
class Freezer:
    """A cgroup that can be frozen: `path` in the cgroup filesystem, `v2` for the unified one."""

    path: Path
    v2: bool

    def freeze(self, frozen: bool) -> None:
        if self.v2:
            (self.path / "cgroup.freeze").write_text("1" if frozen else "0")
        else:
            (self.path / "freezer.state").write_text("FROZEN" if frozen else "THAWED")

    def is_frozen(self) -> bool:
        if self.v2:
            return "frozen 1" in (self.path / "cgroup.events").read_text().splitlines()
        return (self.path / "freezer.state").read_text().strip() == "FROZEN"

    def pids(self) -> list[int]:
        """Every process in the cgroup and its descendants (host pids)."""
        found: list[int] = []
        for procs in sorted(self.path.rglob("cgroup.procs")):
            try:
                found += [int(x) for x in procs.read_text().split()]
            except OSError:  # a child cgroup removed meanwhile
                continue
        return found


def _mounts() -> list[tuple[str, set[str], str, Path]]:
    """This host's cgroup mounts: (fstype, super options, root in the hierarchy, mountpoint)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        parts, extra = fields.split(), tail.split()
        if len(parts) >= 5 and len(extra) >= 3 and extra[0] in ("cgroup", "cgroup2"):
            found.append((extra[0], set(extra[2].split(",")), parts[3], Path(parts[4])))
    return found


def _under(root: str, mountpoint: Path, path: str) -> Path | None:
    """Where cgroup `path` (as /proc/PID/cgroup gives it) is under a mount of `root`."""
    root = root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    return mountpoint / path[len(root):].lstrip("/")


def find_freezer(pid: int, container_id: str) -> Freezer | None:
    """The freezer of the cgroup holding `pid` when that cgroup is the container's and this
    process may write to it; None otherwise."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        mounts = _mounts()
    except OSError:
        return None
    candidates: list[Freezer] = []
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if container_id not in path:  # not this container's cgroup (another host's pid)
            continue
        for fstype, options, root, mountpoint in mounts:
            v2 = hierarchy == "0" and not controllers and fstype == "cgroup2"
            v1 = "freezer" in controllers.split(",") and fstype == "cgroup" and "freezer" in options
            where = _under(root, mountpoint, path) if (v1 or v2) else None
            control = "cgroup.freeze" if v2 else "freezer.state"
            if where is not None and os.access(where / control, os.W_OK):
                candidates.append(Freezer(where, v2))
    candidates.sort(key=lambda f: not f.v2)  # v2 first: SIGKILL reaches frozen tasks there
    return candidates[0] if candidates else None


def _ns_pid(pid: int) -> int | None:
    """`pid`'s number inside its own (innermost) pid namespace; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return pid


def kill_frozen(freezer: Freezer, select: Callable[[int], bool], rounds: int = 5) -> bool:
    """SIGKILL every live process of the cgroup that `select(host_pid)` picks, with the cgroup
    frozen; rounds until none is left. True when none is left; False also when the cgroup
    went away meanwhile (the container stopped)."""
    try:
        for _ in range(rounds):
            freezer.freeze(True)
            try:
                deadline = time.monotonic() + FREEZE_WAIT_S
                while not freezer.is_frozen() and time.monotonic() < deadline:
                    time.sleep(0.01)
                victims = [p for p in freezer.pids() if _alive(p) and select(p)]
                for pid in victims:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            finally:
                freezer.freeze(False)
            if not victims:
                return True
            _wait_gone(victims)
        return not [p for p in freezer.pids() if _alive(p) and select(p)]
    except OSError:
        return False


def outside(keep: set[int]) -> Callable[[int], bool]:
    """Selects the processes whose in-container pid is not in `keep`."""
    return lambda pid: _ns_pid(pid) not in keep


def carrying(entry: str) -> Callable[[int], bool]:
    """Selects the processes whose environment holds `entry` ("NAME=value")."""
    needle = entry.encode()

    def select(pid: int) -> bool:
        try:
            return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False

    return select


def _wait_gone(pids: list[int], wait_s: float = 5.0) -> None:
    """Wait (bounded) until the killed processes have left /proc or are zombies."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
