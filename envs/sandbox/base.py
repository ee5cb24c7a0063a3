"""Sandbox protocol: every backend (docker, local bubblewrap, e2b) implements these methods."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


@runtime_checkable
class Sandbox(Protocol):
    """An isolated machine for one task attempt. Async; `close` must always be safe to call."""

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
