"""Local sandbox: each exec runs under bubblewrap in fresh namespaces on this machine.

Isolation per call: no network (`--unshare-net`, unless the spec allows it), a read-only
allow-list of the host (system folders, a few /etc files, declared `host_paths`: see
host_view.py; no /root, /home, /work, /var, /opt, /run...), a private writable workdir bound
at /workspace, a tmpfs /tmp, a new pid namespace (when the call ends or times out, every
process it started dies with it, setsid or not), `--die-with-parent`, a new session (no
terminal injection), all capabilities dropped, /proc/sys read-only, and rlimits (data size,
file size, no core dumps).

Background processes do not outlive a call here: the pid namespace ends with the command
(and the call's pids cgroup is emptied with SIGKILL), so `end_processes` has nothing to do.

Without bwrap the command runs as a plain subprocess in the workdir: no isolation at all,
so this is only allowed with a loud warning (logged and printed once per process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox.base import (
    MAX_READ_BYTES,
    ExecResult,
    StdioCommand,
    close_pipes,
    process_exited,
)
from envhub.envs.sandbox.disk import SUFFIX, Disk, unmount
from envhub.envs.sandbox.errors import (
    FileTooLarge,
    SandboxClosed,
    SandboxError,
    SandboxFileError,
)
from envhub.envs.sandbox.host_view import host_view_args
from envhub.envs.sandbox.reaper import install, owner_alive, track, untrack
from envhub.envs.sandbox.shell import MAX_STREAM_BYTES

log = logging.getLogger(__name__)

SANDBOX_WORKDIR = "/workspace"
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8", "TERM": "dumb", "HOME": SANDBOX_WORKDIR}
FILE_SIZE_LIMIT = 4 << 30  # one runaway `yes > f` must not fill the host disk


def _within(limit: int, want: int) -> int:
    """`want`, or this process's hard `limit` when that is lower: a sandbox started by a
    process with tighter rlimits (the registry's audit worker) cannot raise them, and asking
    would fail every command."""
    hard = resource.getrlimit(limit)[1]
    return want if hard == resource.RLIM_INFINITY else min(want, hard)
_warned = False


def shell_argv(cmd: str) -> list[str]:
    """`cmd` run by bash, or by sh where there is no bash."""
    return ["bash", "-c", cmd] if shutil.which("bash") else ["sh", "-c", cmd]


def _warn_unisolated() -> None:
    global _warned
    if _warned:
        return
    _warned = True
    message = ("envhub: WARNING: bubblewrap (`bwrap`) not found: local sandboxes run commands "
               "as PLAIN SUBPROCESSES with full access to this machine. Install it "
               "(apt-get install bubblewrap) or use sandbox kind 'docker'.")
    log.warning(message)
    print(message, file=sys.stderr, flush=True)


def bwrap_path() -> str | None:
    """bubblewrap's program, or None: then local sandboxes are plain processes (kinds.PLAIN)."""
    return shutil.which("bwrap")


PIDS_LIMIT = 512  # processes (and threads) one call may have alive: a fork bomb stops here
_PIDS_V1 = Path("/sys/fs/cgroup/pids")
_cgroup_warned = False


def _pids_cgroup() -> Path | None:
    """A fresh pids cgroup (v1 controller) capping one call's processes; None where this
    process cannot make one (not root, no pids controller) — then only the timeout bounds a
    fork bomb."""
    if os.geteuid() != 0 or not (_PIDS_V1 / "cgroup.procs").exists():
        return None
    try:
        group = _PIDS_V1 / "envhub" / f"exec-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        group.mkdir(parents=True)
        (group / "pids.max").write_text(str(PIDS_LIMIT))
        return group
    except OSError as e:
        global _cgroup_warned
        if not _cgroup_warned:  # once per process, not once per call
            _cgroup_warned = True
            log.warning("no pids cgroup for local sandbox calls (%s); fork bombs are bounded "
                        "by the exec timeout only", e)
        return None


def _release_cgroup(group: Path) -> None:
    """Kill whatever is left in the call's cgroup, then remove it."""
    for _ in range(50):
        try:
            pids = [int(x) for x in (group / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    try:
        group.rmdir()
    except OSError:
        pass


class LocalSandbox:
    """A private workdir on this machine; commands run under bwrap (or, loudly, without)."""

    kind = "local"

    def __init__(self, spec: SandboxSpec, host_dir: Path, bwrap: str | None,
                 mount: str = SANDBOX_WORKDIR) -> None:
        self.spec = spec
        self.host_dir = host_dir
        self.bwrap = bwrap
        self.id = f"local-{host_dir.name}"
        # Inside bwrap the workdir is `mount`; a plain subprocess sees the host path.
        self.mount = mount
        self.workdir = mount if bwrap else str(host_dir)
        self.isolated = bwrap is not None
        self.binds: dict[str, str] = {}  # host -> sandbox, read-only (`open(binds=...)`)
        self.disk: Disk | None = None  # the bounded disk (as root; disk.py)
        self._closed = False

    @classmethod
    async def open(cls, spec: SandboxSpec, *, run_id: str, labels: dict[str, str],
                   env: dict[str, str], package_root: str | Path,
                   binds: dict[str, str] | None = None) -> LocalSandbox:
        """The kinds table's entry point (labels live in the workdir's name; `env` is given
        per exec; no images). `binds`: host path -> sandbox path, bound read-only into every
        call (an in-sandbox agent's channel and programs; under /run, which is a tmpfs)."""
        sandbox = await cls.create(spec, run_id)
        sandbox.binds = dict(binds or {})
        return sandbox

    @staticmethod
    def reap(run_id: str | None = None, stale_only: bool = False) -> list[str]:
        return reap_local(run_id, stale_only)

    @classmethod
    async def create(cls, spec: SandboxSpec, run_id: str = "adhoc",
                     allow_unisolated: bool = True, mount: str = SANDBOX_WORKDIR
                     ) -> LocalSandbox:
        """Make the workdir, seen at `mount` inside bwrap. Without bwrap: a loud warning (or
        SandboxUnavailable when `allow_unisolated` is False)."""
        install()
        bwrap = bwrap_path()
        if bwrap is None:
            if not allow_unisolated:
                from envhub.envs.sandbox.errors import SandboxUnavailable
                raise SandboxUnavailable("bubblewrap is missing: apt-get install bubblewrap")
            _warn_unisolated()
        missing = [p for p in spec.host_paths if not os.path.lexists(p)]
        if missing:
            from envhub.envs.sandbox.errors import SandboxError
            raise SandboxError(f"[sandbox] host_paths {missing} do not exist on this machine: "
                               "create them or remove them from the manifest")
        host_dir = Path(tempfile.mkdtemp(prefix=_prefix(run_id) + f"p{os.getpid()}-"))
        host_dir.chmod(0o755)
        sandbox = cls(spec, host_dir, bwrap, mount)
        track(sandbox.id, lambda: _remove(host_dir))
        if bwrap is not None:
            sandbox.disk = await asyncio.to_thread(Disk.mount, host_dir, spec.disk_mb)
        return sandbox

    def _argv(self, cmd: str, cwd: str, env: dict[str, str], program: list[str] | None = None,
              files: dict[str, str] | None = None, scratch: Path | None = None) -> list[str]:
        """bwrap's command line for `cmd` (or `program`, an argv run as is); `files`: host ->
        sandbox, bound read-only into this call only; `scratch`: the call's folder on the
        sandbox's disk (its /tmp and /dev/shm)."""
        shell = program or shell_argv(cmd)
        limits = self.limits()
        if self.bwrap is None:
            return limits + shell
        argv = [self.bwrap, *host_view_args(
            self.spec.network, self.spec.host_paths,
            scratch=str(scratch) if scratch is not None else None,
            scratch_bytes=self.spec.disk_mb << 20)]
        # under /run (a tmpfs), before / turns read-only. `-try`: a bind whose host side is gone
        # is left out, not an error of every later command: the agent channel's folder is
        # removed when the agent phase ends, and grading still runs commands here.
        for host, inside in self.binds.items():
            argv += ["--ro-bind-try", host, inside]
        for host, inside in (files or {}).items():
            argv += ["--ro-bind", host, inside]
        for path in PROC_READ_ONLY:
            argv += ["--ro-bind-try", path, path]
        argv += ["--bind", str(self.host_dir), self.mount, "--remount-ro", "/", "--chdir", cwd,
                 "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                 "--hostname", "sandbox", "--die-with-parent", "--new-session",
                 "--cap-drop", "ALL", "--clearenv"]
        if not self.spec.network:
            argv.append("--unshare-net")
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return argv + limits + shell

    def limits(self) -> list[str]:
        """The argv prefix setting a command's rlimits (data size, file size, no core dumps);
        empty without prlimit."""
        if not shutil.which("prlimit"):
            return []
        data = _within(resource.RLIMIT_DATA, self.spec.memory_mb << 20)
        fsize = _within(resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT)
        return ["prlimit", f"--data={data}", f"--fsize={fsize}", "--core=0", "--"]

    async def exec(self, cmd: str, timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None) -> ExecResult:
        """Run `cmd` (bash) in `cwd` (default the workdir); on timeout the whole tree is killed."""
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        timeout = timeout or self.spec.exec_timeout_s
        cwd = os.path.join(self.workdir, cwd or ".")
        full_env = {**BASE_ENV, "HOME": self.workdir, **(env or {})}
        if self.bwrap is None and not os.path.isdir(cwd):
            return ExecResult(2, "", f"cd: {cwd}: No such file or directory")
        scratch = self.disk.call_dir() if self.disk is not None else None
        try:
            return await self._exec(cmd, timeout, cwd, full_env, scratch)
        finally:
            if scratch is not None:
                await asyncio.to_thread(Disk.release, scratch)

    async def _exec(self, cmd: str, timeout: float, cwd: str, full_env: dict[str, str],
                    scratch: Path | None) -> ExecResult:
        argv = self._argv(cmd, cwd, full_env, scratch=scratch)
        group = _pids_cgroup()
        if group is not None:  # join the capped cgroup before exec'ing the sandbox
            argv = ["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "envhub-exec",
                    *argv]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=str(self.host_dir) if self.bwrap is None else None,
            env=full_env if self.bwrap is None else BASE_ENV,
            start_new_session=True,  # its own process group: killpg reaches every child
        )
        assert proc.stdout is not None and proc.stderr is not None
        readers = asyncio.gather(_read_capped(proc.stdout), _read_capped(proc.stderr))
        start = time.monotonic()
        try:
            timed_out = not await process_exited(proc, timeout)
        finally:
            # Kill the group even after a normal exit: without bwrap, background children
            # would otherwise hold our pipes open (with bwrap the pid namespace is gone).
            _killpg(proc.pid)
            await process_exited(proc, 10)
            if group is not None:
                await asyncio.to_thread(_release_cgroup, group)
        ended, _ = await asyncio.wait({readers}, timeout=10)
        if not ended:  # a grandchild escaped the group (only without bwrap and a cgroup)
            close_pipes(proc)  # EOF to the readers: what the command wrote is kept
        out, err = await readers
        if not ended:
            err += b"\nenvhub: output pipes stayed open after the command ended"
        code = proc.returncode if not timed_out else 124
        if timed_out:
            err += f"\nenvhub: killed after {time.monotonic() - start:.1f}s (timeout)".encode()
        return ExecResult(code if code is not None else -1, out.decode(errors="replace"),
                          err.decode(errors="replace"), timed_out)

    async def stdio_command(self, argv: list[str], *, cwd: str | None = None,
                            env: dict[str, str] | None = None,
                            files: dict[str, str] | None = None) -> StdioCommand:
        """bwrap running `argv` with the isolation of `exec` (its own pid namespace, so the
        agent's commands cannot see or signal it; `--die-with-parent`: it ends with the host
        command). `files` are bound into this process only: the agent never sees them."""
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        if self.bwrap is None:
            raise SandboxError("a process inside a local sandbox needs bubblewrap (apt-get "
                               "install bubblewrap) or sandbox kind 'docker'")
        full_env = {**BASE_ENV, "HOME": self.workdir, **(env or {})}
        where = os.path.join(self.workdir, cwd or ".")
        scratch = self.disk.call_dir() if self.disk is not None else None  # gone at close
        return StdioCommand(self._argv("", where, full_env, program=list(argv), files=files,
                                       scratch=scratch), env=dict(BASE_ENV))

    # -- files: only inside the workdir --------------------------------------------------
    def _host_path(self, path: str, for_write: bool) -> Path:
        """Map a sandbox path to the host, refusing anything outside the workdir (symlinks
        are resolved first, so a link to /etc cannot be used to escape)."""
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        rel = path
        if os.path.isabs(path):
            rel = os.path.relpath(path, self.workdir)
        candidate = (self.host_dir / rel)
        root = self.host_dir.resolve()
        resolved = candidate.resolve()
        if resolved != root and root not in resolved.parents:
            verb = "write" if for_write else "read"
            raise SandboxFileError(f"cannot {verb} {path}: local sandboxes only allow paths "
                                   f"inside the workdir {self.workdir}")
        return resolved

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = self._host_path(path, for_write=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(target.write_bytes, data)
        target.chmod(mode)

    async def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        target = self._host_path(path, for_write=False)
        if not target.is_file():
            raise SandboxFileError(f"{path}: no such file in the sandbox")
        return await asyncio.to_thread(_read_file_capped, target, path, limit)

    async def upload(self, local_path: str, remote_path: str) -> None:
        source = Path(local_path)
        target = self._host_path(remote_path, for_write=True)
        if source.is_dir():
            await asyncio.to_thread(shutil.copytree, source, target, symlinks=True,
                                    dirs_exist_ok=True)
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(shutil.copy2, source, target)
        else:
            raise SandboxFileError(f"{local_path}: no such local file or directory")

    async def download(self, remote_path: str, local_path: str) -> None:
        source = self._host_path(remote_path, for_write=False)
        target = Path(local_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            await asyncio.to_thread(shutil.copytree, source, target, symlinks=True,
                                    dirs_exist_ok=True)
        elif source.is_file():
            await asyncio.to_thread(shutil.copy2, source, target)
        else:
            raise SandboxFileError(f"{remote_path}: no such file in the sandbox")

    async def end_processes(self) -> str:
        """Nothing to do: every call's processes died with its pid namespace (and cgroup)."""
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        return "swept"

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        untrack(self.id)
        await asyncio.to_thread(_remove, self.host_dir)


def _remove(host_dir: Path) -> None:
    """A workdir and the disk mounted for it, gone (also one whose owner died)."""
    unmount(host_dir)
    shutil.rmtree(host_dir, ignore_errors=True)


def _read_file_capped(target: Path, path: str, limit: int) -> bytes:
    """At most `limit` bytes of `target`, refused by its size before any is read (and by what
    was read, for a file that grows meanwhile)."""
    with target.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise FileTooLarge(path, size, limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(path, len(data), limit)
    return data


def _prefix(run_id: str) -> str:
    """Workdir name prefix: run id (sanitised, cut) and, after it, the owner pid, so that
    `reap_local` can find the workdirs of a run or of dead owners."""
    return f"envhub-local-{re.sub(r'[^A-Za-z0-9_.-]', '_', run_id)[:24]}-"


def local_workdirs(run_id: str | None = None, stale_only: bool = False) -> list[Path]:
    """Local sandbox workdirs: of `run_id`, or all, or (stale_only) those whose owner process
    is gone."""
    found = []
    pattern = (_prefix(run_id) if run_id else "envhub-local-*-") + "p*-*"
    for path in Path(tempfile.gettempdir()).glob(pattern):
        match = re.search(r"-p(\d+)-[^-]*$", path.name)
        if match is None or not path.is_dir() or path.name.endswith(SUFFIX):
            continue
        if stale_only and owner_alive(f"{socket.gethostname()}:{match.group(1)}"):
            continue
        found.append(path)
    return found


def reap_local(run_id: str | None = None, stale_only: bool = False) -> list[str]:
    """Remove local workdirs left behind (owner killed with SIGKILL): of `run_id`, or all, or
    (stale_only) those whose owner process is gone. Returns the removed paths."""
    removed = []
    for path in local_workdirs(run_id, stale_only):
        _remove(path)
        untrack(f"local-{path.name}")
        removed.append(str(path))
    return removed


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _read_capped(stream: asyncio.StreamReader) -> bytes:
    """Read to EOF, keeping at most MAX_STREAM_BYTES (the rest is drained and dropped)."""
    kept = bytearray()
    dropped = 0
    while chunk := await stream.read(1 << 16):
        room = MAX_STREAM_BYTES - len(kept)
        kept += chunk[:room]
        dropped += max(0, len(chunk) - room)
    if dropped:
        kept += f"\n[envhub: {dropped} more bytes dropped]".encode()
    return bytes(kept)
