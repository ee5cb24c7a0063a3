"""Sandbox protocols: `Sandbox` (one isolated machine) and `SandboxKind` (how a backend opens
and reaps them). Every backend (docker, local bubblewrap, e2b) implements both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from envhub.envs.manifest import SandboxSpec

# What one read_file brings into the host's memory at most: every answer, state file, deck and
# patch is far smaller; a larger file (a 1 GiB sparse file costs an agent nothing) is refused
# with FileTooLarge before it is read.
MAX_READ_BYTES = 64 << 20


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
