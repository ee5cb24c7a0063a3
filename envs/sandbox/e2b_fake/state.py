"""The fake's sandboxes: each is a LocalSandbox (bubblewrap when present) whose workdir is
seen at /home/user, E2B's default user home."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass, field

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox.local import LocalSandbox

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


class Registry:
    """All live sandboxes of one fake server; expired ones are removed lazily on access."""

    def __init__(self, allow_network: bool = False) -> None:
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.allow_network = allow_network

    async def create(self, template: str, timeout_s: int, metadata: dict[str, str],
                     env_vars: dict[str, str]) -> FakeSandbox:
        spec = SandboxSpec(network=self.allow_network, memory_mb=MEMORY_MB, cpus=CPU_COUNT)
        local = await LocalSandbox.create(spec, run_id="e2bfake", mount=HOME)
        sandbox_id = "i" + secrets.token_hex(10)
        start = now()
        sandbox = FakeSandbox(sandbox_id, template, local, metadata, env_vars, start,
                              start + dt.timedelta(seconds=timeout_s))
        self.sandboxes[sandbox_id] = sandbox
        return sandbox

    async def expire(self) -> None:
        for sandbox in [s for s in self.sandboxes.values() if s.end_at <= now()]:
            await self.kill(sandbox.id)

    async def get(self, sandbox_id: str) -> FakeSandbox | None:
        await self.expire()
        return self.sandboxes.get(sandbox_id)

    async def kill(self, sandbox_id: str) -> bool:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return False
        await sandbox.local.close()
        return True

    async def close(self) -> None:
        for sandbox_id in list(self.sandboxes):
            await self.kill(sandbox_id)
