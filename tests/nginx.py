"""A real nginx (Debian's `nginx` package) on loopback running deploy/nginx/envhub.conf, for
tests and benchmarks of several gateway processes behind one proxy.

The shipped file is used as a user would: only its `listen` port and `server` lines are
edited. nginx runs in the foreground as one process (no privilege drop, no daemon), with its
pid, logs and temp files in a temp dir.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from tests.support import free_port, require

CONF = Path(__file__).resolve().parents[1] / "deploy" / "nginx" / "envhub.conf"
_SERVER = re.compile(r"^(\s*)server 127\.0\.0\.1:\d+( [^;]*)?;\n", re.M)

_MAIN = """daemon off;
master_process off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    include {root}/envhub.conf;
}}
"""


def nginx_binary() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                     else None)
    require(path is not None, "nginx (Debian package `nginx`)")
    return path  # type: ignore[return-value]


def render(upstream_ports: list[int], port: int) -> str:
    """deploy/nginx/envhub.conf with its listen port and one `server` line per gateway."""
    text = CONF.read_text()
    text, n = re.subn(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{port};", text)
    assert n == 1, "deploy/nginx/envhub.conf: expected one `listen 127.0.0.1:PORT;` line"
    first = _SERVER.search(text)
    assert first is not None, "deploy/nginx/envhub.conf: no `server 127.0.0.1:PORT` line"
    indent, options = first.group(1), first.group(2) or ""
    lines = "".join(f"{indent}server 127.0.0.1:{p}{options};\n" for p in upstream_ports)
    return text[:first.start()] + lines + _SERVER.sub("", text[first.start():])


class NginxProxy:
    def __init__(self, upstream_ports: list[int]):
        self.binary = nginx_binary()
        self.root = tempfile.mkdtemp(prefix="envhub-nginx-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        Path(self.root, "envhub.conf").write_text(render(upstream_ports, self.port))
        Path(self.root, "nginx.conf").write_text(_MAIN.format(root=self.root))
        self.proc: subprocess.Popen | None = None

    def start(self) -> NginxProxy:
        args = [self.binary, "-p", self.root, "-e", f"{self.root}/error.log",
                "-c", f"{self.root}/nginx.conf"]
        check = subprocess.run([*args, "-t"], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.errors()}")
            try:
                httpx.get(f"{self.url}/health", timeout=2)
                return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer on {self.url}: {self.errors()}")

    def errors(self) -> str:
        path = Path(self.root, "error.log")
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
