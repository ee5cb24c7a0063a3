"""Sandboxes: isolated machines for task attempts (docker, local bubblewrap, e2b).

Public API (everything else in this package is internal):

    sandbox = await open_sandbox("auto", spec, run_id="run-1",
                                 workdir_files={"main.py": b"print(1)"})
    try:
        result = await sandbox.exec("python main.py", timeout=30)   # ExecResult
    finally:
        await sandbox.close()

* `open_sandbox(kind, spec, ...)` -> `Sandbox` (see base.py for the protocol).
  kind: a name of the kinds table (kinds.py: "docker" | "local" | "e2b"), "auto" (docker
  when reachable, else local), or a dotted path to your own `SandboxKind` class.
* `best_available()` -> the kind "auto" resolves to.
* `reap(run_id=None, stale_only=False)` -> ids removed: docker containers, e2b sandboxes
  and local workdirs of a run (or all envhub ones; or only those whose owner process died).

Every sandbox is labelled `envhub.sandbox=1`, `envhub.run=<run_id>`,
`envhub.owner=<host>:<pid>` and removed on `close()`, at interpreter exit, on SIGTERM/SIGHUP,
or by `reap` (`envhub sandbox reap` from the shell). Infrastructure failures raise
`SandboxError` subclasses (map them to `env_failure`); a failing command is not an error,
it is an `ExecResult` with a non-zero exit code.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox.base import ExecResult, Sandbox, SandboxKind
from envhub.envs.sandbox.errors import (
    ImageBuildError,
    SandboxClosed,
    SandboxError,
    SandboxFileError,
    SandboxUnavailable,
)
from envhub.envs.sandbox.kinds import AUTO, SANDBOXES, sandbox_class

__all__ = [
    "SANDBOXES", "ExecResult", "ImageBuildError", "Sandbox", "SandboxClosed", "SandboxError",
    "SandboxFileError", "SandboxKind", "SandboxSpec", "SandboxUnavailable", "best_available",
    "open_sandbox", "reap",
]


def best_available() -> Literal["docker", "local"]:
    """"docker" when the SDK is installed and the engine answers, else "local"."""
    from envhub.envs.sandbox.engine import docker_reachable

    return "docker" if docker_reachable() else "local"


DISK_ENV = "ENVHUB_SANDBOX_DISK_MB"  # --sandbox-disk-mb of `envhub run` / `train`


def with_disk_override(spec: SandboxSpec) -> SandboxSpec:
    """`spec` with the run-wide disk bound ($ENVHUB_SANDBOX_DISK_MB, which --sandbox-disk-mb
    sets) instead of its manifest's, when one is set."""
    value = os.environ.get(DISK_ENV)
    if not value:
        return spec
    try:
        return spec.model_copy(update={"disk_mb": max(16, int(value))})
    except ValueError:
        raise SandboxUnavailable(f"{DISK_ENV}={value!r}: give a whole number of MB") from None


async def open_sandbox(
    kind: str,
    spec: SandboxSpec | None = None,
    *,
    run_id: str | None = None,
    workdir_files: Mapping[str, bytes | str] | None = None,
    labels: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    package_root: str | Path = ".",
    binds: Mapping[str, str] | None = None,
) -> Sandbox:
    """Start a sandbox of `kind` for `spec` and seed its workdir with `workdir_files`
    (relative path -> content). `package_root` resolves the spec's `dockerfile`.

    docker: the image is the spec's `dockerfile` built on the envhub base, else its `image`,
    else the base image (built with debootstrap on first use, then cached).
    e2b: the spec's `image` names the E2B template (default "base"); needs E2B_API_KEY.
    Raises SandboxUnavailable (with the fix) when the backend cannot run here; the sandbox
    is closed again if seeding the files fails, so nothing leaks.
    `binds` (host path -> sandbox path, read-only) is for in-sandbox agents: docker and local
    take it; other kinds refuse it.
    """
    cls = sandbox_class(best_available() if kind == AUTO else kind)
    spec = with_disk_override(spec or SandboxSpec())
    run_id = run_id or f"adhoc-{uuid.uuid4().hex[:8]}"
    extra = {"binds": dict(binds)} if binds else {}
    if extra and getattr(cls, "kind", None) not in ("docker", "local"):
        raise SandboxUnavailable(f"sandbox kind {kind!r} cannot bind host folders, so command "
                                 "agents cannot run inside it; use docker or local, or "
                                 "--agent-on-host")
    sandbox = await cls.open(spec or SandboxSpec(), run_id=run_id, labels=dict(labels or {}),
                             env=dict(env or {}), package_root=package_root, **extra)
    try:
        for path, content in (workdir_files or {}).items():
            data = content.encode() if isinstance(content, str) else content
            await sandbox.write_file(path, data)
    except BaseException:
        await sandbox.close()
        raise
    return sandbox


def reap(run_id: str | None = None, stale_only: bool = False,
         kinds: Iterable[str] | None = None) -> list[str]:
    """Remove envhub sandboxes (blocking): of `run_id`, or all of them, or with `stale_only`
    those whose owner process is gone; of `kinds` (default: every kind of the table).
    Backends that are not reachable are skipped."""
    removed: list[str] = []
    for kind in kinds if kinds is not None else SANDBOXES:
        removed += sandbox_class(kind).reap(run_id, stale_only)
    return removed
