"""The fake's sandboxes: each is a LocalSandbox (bubblewrap when present) whose workdir is
seen at /home/user, E2B's default user home.

As in E2B's microVM, a sandbox is one machine for all its commands: as root with nsenter, one
bwrap per sandbox holds its namespaces (pid, mount, network, ipc, uts, cgroup: one /tmp, one
process table) and every command joins them, capabilities dropped. A process a command leaves
behind (setsid, a double fork) lives on beside later commands until something kills it or the
sandbox ends, so the client's own clean-up is what is tested. The holder is the pid namespace's
init, which the kernel shields from the sandbox's own signals (`kill -9 -1` inside leaves it,
as E2B's envd survives its commands); it reaps orphans. Should it die all the same, the sandbox
is gone, as a crashed microVM is: "not found" from then on. Without root, nsenter or setpriv
each command gets fresh namespaces of its own (LocalSandbox's isolation per call), said once in
the log: then nothing a command starts outlives it, whatever the client does.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import secrets
import shutil
import signal
from dataclasses import dataclass, field
from typing import ClassVar

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox.local import BASE_ENV, LocalSandbox, shell_argv

log = logging.getLogger(__name__)
HOLDER_START_S = 20.0
STOP_S = 20.0  # for a machine's processes to be killed and reaped

HOME = "/home/user"
ENVD_VERSION = "0.6.4"  # newest envd features the SDK gates on (octet-stream upload, ...)
CPU_COUNT, MEMORY_MB, DISK_MB = 2, 1024, 4096


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


@dataclass
class FakeSandbox:
    id: str
    template: str
    local: LocalSandbox
    metadata: dict[str, str]
    env_vars: dict[str, str]
    started_at: dt.datetime
    end_at: dt.datetime
    access_token: str = field(default_factory=lambda: secrets.token_hex(16))
    machine: Machine | None = None

    def argv(self, cmd: str, cwd: str, env: dict[str, str]) -> list[str]:
        """The command line running `cmd` in this sandbox: joining its machine's namespaces,
        or in fresh ones of its own (LocalSandbox's) where it has none."""
        if self.machine is None:
            return self.local._argv(cmd, cwd, env)
        return ["nsenter", "-t", str(self.machine.pid), "-m", "-u", "-i", "-n", "-p", "-C",
                "-r", "--", "setpriv", "--no-new-privs", "--bounding-set=-all",
                "--inh-caps=-all", "--", "env", "-i", "-C", cwd, "--",
                *(f"{k}={v}" for k, v in env.items()), *self.local.limits(), *shell_argv(cmd)]

    def to_local(self, path: str) -> str:
        """A sandbox path as the LocalSandbox sees it (identical under bwrap; without bwrap
        the workdir is a host directory, so /home/user is rewritten to it)."""
        if self.local.isolated:
            return path
        if path == HOME or path.startswith(HOME + "/"):
            return self.local.workdir + path[len(HOME):]
        return path

    def listed(self) -> dict[str, object]:
        """The `ListedSandbox` JSON of the E2B API."""
        return {
            "templateID": self.template, "sandboxID": self.id, "clientID": "fake",
            "alias": self.template, "startedAt": iso(self.started_at), "endAt": iso(self.end_at),
            "cpuCount": CPU_COUNT, "memoryMB": MEMORY_MB, "diskSizeMB": DISK_MB,
            "metadata": self.metadata, "state": "running", "envdVersion": ENVD_VERSION,
        }

    def detail(self) -> dict[str, object]:
        return {**self.listed(), "envdAccessToken": self.access_token, "domain": None}


# pid 1 of the sandbox: dash reaps any child while it waits for its own `sleep`
INIT = "echo up; exec >/dev/null; while :; do sleep 3600; done"


@dataclass
class Machine:
    """The bwrap holding one sandbox's namespaces; `pid` is its init (nsenter's target), a
    child of `proc` (bwrap's outer process, ours: it cannot be another's pid while unreaped),
    `pidfd` a handle on the init that never names another process."""
    proc: asyncio.subprocess.Process
    pid: int
    pidfd: int
    said_per_call: ClassVar[bool] = False

    @property
    def alive(self) -> bool:
        # bwrap's outer process ends when its init does (and is reaped by us only then)
        return self.proc.returncode is None

    @classmethod
    async def start(cls, local: LocalSandbox) -> Machine | None:
        if (local.bwrap is None or os.geteuid() != 0
                or not all(shutil.which(t) for t in ("nsenter", "setpriv"))):
            if not Machine.said_per_call:
                Machine.said_per_call = True
                log.warning("fake E2B: no bwrap, root, nsenter or setpriv; each command gets "
                            "namespaces of its own, so nothing a command starts outlives it")
            return None
        argv = local._argv("", HOME, dict(BASE_ENV), program=["sh", "-c", INIT])
        info_r, info_w = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                argv[0], "--as-pid-1", "--info-fd", str(info_w), *argv[1:], pass_fds=(info_w,),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                start_new_session=True)
        except BaseException:
            os.close(info_r)
            raise
        finally:
            os.close(info_w)
        try:
            # bwrap writes the info before it builds the root: joined now, a command could see
            # a half-made one; "up" comes from inside the finished sandbox.
            assert proc.stdout is not None
            up = await asyncio.wait_for(proc.stdout.readline(), HOLDER_START_S)
            if up != b"up\n":
                raise RuntimeError(f"the sandbox's bwrap did not start: {up!r}")
            pid = int(json.loads(os.read(info_r, 1 << 16).decode())["child-pid"])
            pidfd = os.pidfd_open(pid)  # the init is up (it said so): `pid` is still its
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        finally:
            os.close(info_r)
        return cls(proc, pid, pidfd)

    async def stop(self) -> None:
        """Kill bwrap's outer process and the init, and wait until the init's exit is reported:
        by then the kernel has killed and reaped every other process of the pid namespace (the
        outer process's death alone ends the init a moment later, which a check right after
        close could beat: seen once in CI)."""
        loop = asyncio.get_running_loop()
        gone = loop.create_future()
        try:
            if self.proc.returncode is None:  # the init gets SIGKILL with it (PDEATHSIG)
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

            def ended() -> None:
                if not gone.done():
                    gone.set_result(None)

            loop.add_reader(self.pidfd, ended)
            try:
                await asyncio.wait_for(gone, STOP_S)
            except TimeoutError:
                log.warning("fake E2B: a sandbox's init did not end within %gs", STOP_S)
            finally:
                loop.remove_reader(self.pidfd)
        finally:
            os.close(self.pidfd)
            await self.proc.wait()


class Registry:
    """All live sandboxes of one fake server; expired ones are removed lazily on access."""

    def __init__(self, allow_network: bool = False) -> None:
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.allow_network = allow_network

    async def create(self, template: str, timeout_s: int, metadata: dict[str, str],
                     env_vars: dict[str, str]) -> FakeSandbox:
        spec = SandboxSpec(network=self.allow_network, memory_mb=MEMORY_MB, cpus=CPU_COUNT)
        local = await LocalSandbox.create(spec, run_id="e2bfake", mount=HOME)
        try:
            machine = await Machine.start(local)
        except BaseException:
            await local.close()
            raise
        sandbox_id = "i" + secrets.token_hex(10)
        start = now()
        sandbox = FakeSandbox(sandbox_id, template, local, metadata, env_vars, start,
                              start + dt.timedelta(seconds=timeout_s), machine=machine)
        self.sandboxes[sandbox_id] = sandbox
        return sandbox

    async def expire(self) -> None:
        for sandbox in [s for s in self.sandboxes.values() if s.end_at <= now()]:
            await self.kill(sandbox.id)

    async def get(self, sandbox_id: str) -> FakeSandbox | None:
        await self.expire()
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is not None and sandbox.machine is not None and not sandbox.machine.alive:
            log.warning("fake E2B: sandbox %s's machine died; it is gone", sandbox_id)
            await self.kill(sandbox_id)
            return None
        return sandbox

    async def kill(self, sandbox_id: str) -> bool:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return False
        try:
            if sandbox.machine is not None:
                await sandbox.machine.stop()
        finally:
            await sandbox.local.close()
        return True

    async def close(self) -> None:
        for sandbox_id in list(self.sandboxes):
            await self.kill(sandbox_id)
