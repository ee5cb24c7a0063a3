"""Fixtures for registry tests: environment folders, an isolated ENVHUB_HOME, and a real
`envhub registry serve` process on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import free_port

ENVHUB = [sys.executable, "-m", "envhub"]


def make_env(folder: Path, name: str = "my-env", version: str = "1.2.0",
             description: str = "a tiny test environment", extra: str = "",
             body: str = "") -> Path:
    """An environment folder with a valid envhub.toml, an entrypoint module and tasks."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "envhub.toml").write_text(
        f'name = "{name}"\nversion = "{version}"\ndescription = "{description}"\n'
        f'entrypoint = "env:TinyEnv"\n{extra}\n[tasks]\npath = "tasks.jsonl"\n',
        encoding="utf-8")
    (folder / "env.py").write_text(
        f'"""Test environment {name} {version}."""\n\n\nclass TinyEnv:\n    VERSION = '
        f'"{version}"\n{body}', encoding="utf-8")
    (folder / "tasks.jsonl").write_text('{"id": "t1", "prompt": "say hi"}\n', encoding="utf-8")
    return folder


def tree(root: Path) -> set[str]:
    """Every path under `root` (files and folders), to assert nothing was left behind."""
    if not root.exists():
        return set()
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def run_cli(*args: str, env: dict[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENVHUB, *args], capture_output=True, text=True, env=env,
                          input=input, timeout=300, check=False)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ENVHUB_HOME (and no registry/token leaking in from the environment)."""
    h = tmp_path / "envhub-home"
    h.mkdir()
    monkeypatch.setenv("ENVHUB_HOME", str(h))
    for var in ("ENVHUB_REGISTRY", "ENVHUB_TOKEN", "ENVHUB_NO_DEPS"):
        monkeypatch.delenv(var, raising=False)
    return h


@dataclass
class Server:
    url: str
    data: Path
    tokens: dict[str, str]  # owner -> token
    proc: subprocess.Popen[bytes]

    @property
    def blobs(self) -> Path:
        return self.data / "blobs"


def start_server(data: Path, db: str | None = None, max_upload_mb: float = 1.0,
                 *flags: str) -> Server:
    """`envhub registry serve` as a subprocess; tokens for alice and bob created by CLI."""
    db_args = ["--db", db] if db else []
    tokens = {}
    for owner in ("alice", "bob"):
        out = run_cli("registry", "token", "create", "--owner", owner, "--data", str(data),
                      *db_args)
        assert out.returncode == 0, out.stderr
        tokens[owner] = out.stdout.strip()
    port = free_port()
    env = {**os.environ, "ENVHUB_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [*ENVHUB, "registry", "serve", "--port", str(port), "--data", str(data),
         "--max-upload-mb", str(max_upload_mb), *db_args, *flags], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"registry server did not start (exit {proc.poll()})")
        time.sleep(0.2)
    return Server(url, data, tokens, proc)


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One SQLite-backed registry per test module (uploads limited to 1 MiB)."""
    srv = start_server(tmp_path_factory.mktemp("registry-data"))
    yield srv
    stop_server(srv)


# Raw HTTP helpers of the registry API (test_server.py, test_hardening.py)
API = "/api/v1"


def put(server: Server, path: str, data: bytes, token: str | None,
        headers: dict[str, str] | None = None) -> httpx.Response:
    h = {"Content-Type": "application/gzip", **(headers or {})}
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    return httpx.put(f"{server.url}{API}{path}", content=data, headers=h, timeout=60)
