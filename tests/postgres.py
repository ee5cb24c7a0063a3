"""A real PostgreSQL server for tests, from Debian's binaries (the `postgresql` package).

`PostgresServer` runs initdb in a temp dir and `pg_ctl start` on a free loopback port. The
server refuses to run as root, so as root it runs as the `postgres` system user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid

from tests.support import free_port, require


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


class PostgresServer:
    def __init__(self) -> None:
        bindir = _bindir()
        require(bindir is not None, "PostgreSQL server binaries (Debian package `postgresql`)")
        self.bindir = bindir
        self.root = tempfile.mkdtemp(prefix="envhub-pg-")
        os.chmod(self.root, 0o755)
        self.data = os.path.join(self.root, "data")
        self.port = free_port()
        self._as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as_user:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        subprocess.run(self._as_user + list(args), check=True, capture_output=True, cwd="/")

    def start(self) -> PostgresServer:
        self._run(f"{self.bindir}/initdb", "-D", self.data, "-U", "postgres", "-A", "trust",
                  "--no-sync")
        self.restart()
        return self

    def restart(self) -> None:
        """Start the server (again, after `halt`) on the same data and port; returns once it
        accepts connections (pg_ctl -w)."""
        self._run(f"{self.bindir}/pg_ctl", "-D", self.data, "-l", f"{self.root}/log", "-w",
                  "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off -c max_connections=300", "start")

    def halt(self) -> None:
        """Stop the server as a crash would (immediate mode), keeping its data for `restart`."""
        self._run(f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def create_database(self) -> str:
        """A fresh database; returns its SQLAlchemy-style URL."""
        name = f"db_{uuid.uuid4().hex[:12]}"
        self._run(f"{self.bindir}/createdb", "-h", "127.0.0.1", "-p", str(self.port),
                  "-U", "postgres", name)
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run(f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        deadline = time.time() + 10
        while os.path.exists(f"{self.data}/postmaster.pid") and time.time() < deadline:
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)
