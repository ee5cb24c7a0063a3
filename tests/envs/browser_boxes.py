"""For the browser environments' tests: real sandboxes of one kind behind a RunContext, as the
runner gives them (every sandbox opened is closed at the end), and the skip/fail checks."""

from __future__ import annotations

from pathlib import Path

from envhub.envs.environment import RunContext
from envhub.envs.loader import LoadedEnv
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox
from tests.support import require_browser, require_docker, require_tool

KINDS = ("local", "docker")


def require_kind(kind: str) -> None:
    """Playwright and Chromium, and the sandbox kind (bubblewrap or a Docker engine)."""
    require_browser()
    if kind == "local":
        require_tool("bwrap")
    else:
        require_docker()


class Boxes:
    """A RunContext opening `kind` sandboxes for `loaded`'s package, all closed by `close`."""

    def __init__(self, loaded: LoadedEnv, kind: str, scratch: Path) -> None:
        self.loaded, self.kind = loaded, kind
        self.opened: list[Sandbox] = []
        self.ctx = RunContext(run_id=f"test-{loaded.name}", sandbox_kind=kind,
                              open_sandbox=self.open, scratch=scratch)

    async def open(self, spec: SandboxSpec) -> Sandbox:
        box = await open_sandbox(self.kind, spec, run_id=f"test-{self.loaded.name}",
                                 package_root=self.loaded.folder)
        self.opened.append(box)
        return box

    async def close(self) -> None:
        for box in self.opened:
            await box.close()
