"""Start `envhub engine` as a child process and wait until it serves (tests, benches, fleets).

    with EngineProcess(["--zero"]) as engine:
        httpx.get(engine.url + "/health")
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Self

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EngineProcess:
    """One `python -m envhub engine ...` child on 127.0.0.1; its output goes to `log_path`."""

    def __init__(self, args: list[str] | None = None, *, port: int | None = None,
                 startup_timeout: float = 180.0, log_path: str | Path | None = None,
                 env: dict[str, str] | None = None):
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = list(args or [])
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else None
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> Self:
        command = [sys.executable, "-m", "envhub", "engine", "--port", str(self.port), *self.args]
        self._log = open(self.log_path, "wb") if self.log_path else None  # noqa: SIM115
        self.process = subprocess.Popen(
            command, stdout=self._log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
            env=self.env)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"envhub engine exited with {self.process.returncode} "
                                   f"before serving{self._log_hint()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"envhub engine did not serve within {self.startup_timeout} s"
                           f"{self._log_hint()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _log_hint(self) -> str:
        return f" (see {self.log_path})" if self.log_path else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
