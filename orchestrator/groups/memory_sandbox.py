"""The sandbox of environments that need none (`[sandbox] kind = "none"`): an in-process file
store. It runs no commands: `exec` answers exit code 127 with an explanation, so a tool that
tries to run one gets a clear error instead of touching the host.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from envhub.envs.sandbox.base import MAX_READ_BYTES, ExecResult
from envhub.envs.sandbox.errors import FileTooLarge, SandboxClosed, SandboxFileError


class MemorySandbox:
    """Files kept in a dict keyed by normalised absolute path; nothing touches the disk except
    `upload`/`download`, which copy between the host and the store."""

    def __init__(self) -> None:
        self.id = "mem-" + uuid.uuid4().hex[:12]
        self._files: dict[str, bytes] = {}
        self._closed = False

    def _key(self, path: str) -> str:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        parts: list[str] = []
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
        return "/" + "/".join(parts)

    async def exec(
        self, cmd: str, timeout: float | None = None, cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        self._key("/")  # raises when closed
        return ExecResult(127, "", "this environment has no sandbox to run commands in "
                          "([sandbox] kind = \"none\"); use the environment's own tools")

    async def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        key = self._key(path)
        if key not in self._files:
            raise SandboxFileError(f"{path}: no such file in sandbox {self.id}")
        if len(self._files[key]) > limit:
            raise FileTooLarge(path, len(self._files[key]), limit)
        return self._files[key]

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._files[self._key(path)] = bytes(data)

    async def upload(self, local_path: str, remote_path: str) -> None:
        self._files[self._key(remote_path)] = Path(local_path).read_bytes()

    async def download(self, remote_path: str, local_path: str) -> None:
        Path(local_path).write_bytes(await self.read_file(remote_path))

    async def end_processes(self) -> str:
        return "swept"  # no processes: commands are not run here

    async def close(self) -> None:
        self._closed = True
        self._files.clear()
