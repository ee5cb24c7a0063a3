"""Shared test helpers (import as `from tests.support import require`).

`require(...)` skips a test whose service or tool is missing on a developer's machine; in CI
(`CI=true`) the same situation fails the test, because CI provisions everything (.ci/run).
Also: a real gateway on loopback answering from a script, the `envhub` CLI as a subprocess,
and checks that a run left nothing behind. The gateway is imported when first used, so tests
that do not start one do not pay for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

if TYPE_CHECKING:
    from envhub.gateway.backends.scripted import ScriptedBackend
    from envhub.gateway.render.chat_template import ChatRenderer
    from envhub.gateway.server import GatewayHandle

REPO = Path(__file__).resolve().parents[1]  # the checkout
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def default_sigint() -> None:
    """`preexec_fn` for a child a test interrupts with SIGINT: Ctrl-C's default action even when
    the test process ignores SIGINT at that moment (an ignored signal is inherited across exec,
    and a Python started with SIGINT ignored never raises KeyboardInterrupt; under CI both
    SIGINT tests once saw their child ignore the signal while the SIGTERM ones passed)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


def require_browser() -> None:
    """Playwright (`envhub[browser]`) and a Chromium executable (Debian's `chromium`)."""
    from envhub.envs.browser.chromium import BrowserUnavailable, chromium_path, playwright_core

    try:
        playwright_core()
        chromium_path()
    except BrowserUnavailable as e:
        require(False, str(e))


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


@lru_cache(maxsize=1)
def bundled_renderer() -> ChatRenderer:
    """The bundled tiny model's chat renderer (real tokenizer and template), loaded once."""
    from envhub.gateway.config import BUNDLED_MODEL
    from envhub.gateway.render.chat_template import ChatRenderer

    return ChatRenderer.from_pretrained(BUNDLED_MODEL)


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A completion text holding one Hermes-format tool call (the bundled template's format)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def scripted_backend(script: list[str]) -> ScriptedBackend:
    """Completions from `script` (cycling), tokenized by the bundled renderer."""
    from envhub.gateway.backends.scripted import ScriptedBackend

    r = bundled_renderer()
    return ScriptedBackend(r.encode, script, r.stop_token_ids[0])


def gateway_in_thread(tmp_path: Path, backend: Any = None, **config: Any) -> GatewayHandle:
    """A real gateway on a free loopback port with its pool in `tmp_path`; `backend` is an
    instance (e.g. `scripted_backend(...)`), else `config` picks one (`backend="zero"`).
    The caller closes the handle."""
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.server import run_in_thread

    return run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{tmp_path}/pool.db", **config),
                         backend=backend)


def trajectory_json(gw: GatewayHandle, session_id: str, admin_key: str | None = None) -> dict:
    """A session's trajectory as the gateway's HTTP API returns it."""
    headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    r = httpx.get(f"{gw.url}/sessions/{session_id}/trajectory", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def envhub(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
           timeout: float = 540) -> subprocess.CompletedProcess:
    """`python -m envhub ARGS` as a user runs it; `env` adds to this process's environment. The
    timeout stays under pytest's (600 s) so a hang fails with the command's output."""
    return subprocess.run([sys.executable, "-m", "envhub", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, check=False)


def run_leftovers(run_id: str) -> list[Path]:
    """Scratch folders a run left in the temp dir (a finished run removes them all)."""
    return list(Path(tempfile.gettempdir()).glob(f"envhub-{run_id}-*"))


def host_processes_with(token: str) -> list[str]:
    """Lines of `ps` on the host whose command line contains `token`."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if token in line and "ps -eo" not in line]


def until(condition: Callable[[], bool], within_s: float = 30.0) -> bool:
    """Whether `condition()` holds within `within_s`, looked at every 20 ms."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def ended(pid: int, within_s: float = 10.0) -> bool:
    """Whether process `pid` is gone (or a zombie) within `within_s`: a signal is delivered when
    its process next runs, which a loaded machine can delay past the sender's next line."""

    def gone() -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        return state in ("Z", "X")

    return until(gone, within_s)


def start_gateway(db: str, port: int, extra: list[str] | None = None,
                  backend: str = "zero") -> subprocess.Popen:
    # output to a file: an undrained pipe would block the server once its buffer fills
    log = tempfile.NamedTemporaryFile(prefix="envhub-gw-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub", "gateway", "--backend", backend, "--port", str(port),
         "--db", db, *(extra or [])],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(open(log.name).read())
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("gateway did not start")


async def agent(url: str, key: str, answered: list, stop: asyncio.Event) -> None:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=10)
    msgs = [{"role": "user", "content": f"session {key}"}]
    while not stop.is_set():
        try:
            resp = await client.chat.completions.create(model="default", messages=msgs)
        except (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError):
            return  # the gateway died under us
        answered.append((key, resp.model_extra["envhub"]["seqs"][0],
                         resp.choices[0].message.content))
        msgs += [resp.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "again"}]


def copy_checkout(dest: Path) -> None:
    """The checkout's files as a fresh clone would have them (tracked and new, not ignored:
    no .venv, no runs/)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")
    present = b"\0".join(f for f in files if f and os.path.lexists(REPO / f.decode()))
    tar = subprocess.run(["tar", "--null", "-T", "-", "-cf", "-"], cwd=REPO, input=present,
                         capture_output=True, check=True).stdout
    dest.mkdir()
    subprocess.run(["tar", "-xf", "-", "-C", str(dest)], input=tar, check=True)
