"""Sandbox protocol: every backend (docker, local bubblewrap, e2b) implements these methods."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


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
        self, cmd: str, timeout: float = 60.0, cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def upload(self, local_path: str, remote_path: str) -> None: ...

    async def download(self, remote_path: str, local_path: str) -> None: ...

    async def close(self) -> None: ...
