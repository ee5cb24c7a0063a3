"""Sandbox protocols: `Sandbox` (one isolated machine) and `SandboxKind` (how a backend opens
and reaps them). Every backend (docker, local bubblewrap, e2b) implements both."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from envhub.envs.manifest import SandboxSpec

# What one read_file brings into the host's memory at most: every answer, state file, deck and
# patch is far smaller; a larger file (a 1 GiB sparse file costs an agent nothing) is refused
# with FileTooLarge before it is read.
MAX_READ_BYTES = 64 << 20


async def process_exited(proc: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Whether `proc` itself ended within `timeout_s`. Not `proc.wait()` alone: on Python 3.11
    that also waits for every holder of its pipes to close them, and a process it started in a
    session of its own (setsid: out of reach of a signal to its group) may hold them for as
    long as it lives. `wait()` still ends this at once in the usual case; otherwise the exit
    status, set when the process is reaped, is looked at every 50 ms at first, backing off to
    every second (thousands of calls run at once: a fixed short poll would cost a core)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    waiter = asyncio.ensure_future(proc.wait())
    poll = 0.05
    try:
        while proc.returncode is None and not waiter.done():
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.wait({waiter}, timeout=min(left, poll))
            poll = min(2 * poll, 1.0)
        return True
    finally:
        waiter.cancel()


def close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close our ends of `proc`'s pipes: its stream readers see EOF and keep what they read,
    and the transport closes on this loop (not in a garbage collection after the loop has
    closed). For pipes an escaped process still holds. asyncio has no public close for a
    Process; its `_transport` attribute has been there since Python 3.4."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


@dataclass
class ExecResult:
    """Outcome of one command. `timed_out` is True when the deadline killed it (every process
    it started is gone; `exit_code` is then 124/137 or -1). Output is decoded as UTF-8 with
    replacement, at most 8 MiB per stream."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


@runtime_checkable
class Sandbox(Protocol):
    """An isolated machine for one task attempt. Async; `close` must always be safe to call.

    Relative paths and the default `cwd` refer to the sandbox's workdir (/workspace for
    docker and local, /home/user for e2b; implementations expose it as `.workdir`).
    Implementations also accept `timeout=None`, meaning the spec's `exec_timeout_s`.
    A command failing is an ExecResult; infrastructure failing raises
    `envhub.envs.sandbox.errors.SandboxError`.
    """

    id: str

    async def exec(
        self, cmd: str, timeout: float | None = None, cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult: ...

    async def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        """The file's bytes; FileTooLarge (before reading) when it holds more than `limit`."""
        ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def upload(self, local_path: str, remote_path: str) -> None: ...

    async def download(self, remote_path: str, local_path: str) -> None: ...

    async def end_processes(self) -> str:
        """Kill every process the sandbox's commands started, running or detached (the agent
        phase is over: nothing it left may run while it is graded); files are kept. Returns
        how ("swept", or "restarted" where the container had to be)."""
        ...

    async def close(self) -> None: ...


@dataclass
class StdioCommand:
    """A host command line whose stdin and stdout are those of a process inside a sandbox
    (`HostsStdio`): run it with pipes and talk to the process. `started` is awaited once the
    process answered (docker: it is spared from the sweeps that follow every exec, until
    `end_processes`)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # the host command's environment
    started: Callable[[], Awaitable[None]] | None = None


@runtime_checkable
class HostsStdio(Protocol):
    """Optional capability of a sandbox: a long-lived process inside it, spoken to over its
    stdin/stdout (an environment's stdio MCP servers, envs/mcp/client.py). docker and local
    (bubblewrap) have it; e2b does not."""

    async def stdio_command(self, argv: list[str], *, cwd: str | None = None,
                            env: dict[str, str] | None = None,
                            files: dict[str, str] | None = None) -> StdioCommand:
        """How to start `argv` in `cwd` (default the workdir) with `env`; `files`: host path ->
        sandbox path, made visible to that process read-only. The process must die with the
        host command, and at the latest with `end_processes`."""
        ...


class SandboxKind(Protocol):
    """A sandbox implementation as the kinds table (`kinds.py`) sees it: the class itself,
    with `open` a classmethod and `reap` a staticmethod (nothing to instantiate first)."""

    kind: str

    async def open(self, spec: SandboxSpec, *, run_id: str, labels: dict[str, str],
                   env: dict[str, str], package_root: str | Path) -> Sandbox:
        """A started sandbox for `spec` (its image built or found first where the kind has
        images; `package_root` resolves a spec's `dockerfile`). Labels carry run and owner.
        Kinds that can host command agents (docker, local) also take `binds`: host path ->
        sandbox path, bound read-only (the agent's channel and programs)."""
        ...

    def reap(self, run_id: str | None = None, stale_only: bool = False) -> list[str]:
        """Remove this kind's leaked sandboxes: of `run_id`, or all envhub ones, or those whose
        owner process is gone; returns their ids. [] when the backend is not reachable."""
        ...
