"""Shared test helpers (import as `from tests.support import require`).

`require(...)` skips a test whose service or tool is missing on a developer's machine; in CI
(`CI=true`) the same situation fails the test, because CI provisions everything (.ci/run).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, what: str) -> None:
    """Skip (locally) or fail (in CI) when `what` is not available."""
    if condition:
        return
    message = f"missing: {what} (.ci/run provisions it)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def require_tool(name: str) -> str:
    path = shutil.which(name)
    require(path is not None, f"the `{name}` program")
    return path  # type: ignore[return-value]


def docker_reachable() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def require_docker() -> None:
    require(docker_reachable(), "a running Docker engine (`dockerd`)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
