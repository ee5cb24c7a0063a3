"""The registry server on a real PostgreSQL (Debian's server binaries, started here)."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from envhub.registry.archive import pack
from tests.registry.conftest import Server, make_env, run_cli, start_server, stop_server, tree
from tests.support import free_port, require

pytestmark = pytest.mark.postgres
API = "/api/v1"


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    bindir = _pg_bin()
    require(bindir is not None, "PostgreSQL server binaries (apt-get install postgresql)")
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="envhub-pg-"))
    prefix: list[str] = []
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root: run it as the `postgres` system user.
        require(shutil.which("runuser") is not None, "runuser (util-linux)")
        shutil.chown(root, "postgres", "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()
    subprocess.run([*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "envhub",
                    "--auth=trust", "--no-sync"], check=True, capture_output=True, timeout=120)
    subprocess.run([*prefix, str(bindir / "pg_ctl"), "start", "-w", "-D", str(data),
                    "-l", str(root / "log"), "-o",
                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"],
                   check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql://envhub@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, str(bindir / "pg_ctl"), "stop", "-m", "fast", "-D",
                        str(data)], capture_output=True, timeout=120, check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_server(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("pg-registry"), db=postgres_url)
    yield srv
    stop_server(srv)


def test_round_trip_on_postgres(pg_server: Server, tmp_path: Path) -> None:
    env = make_env(tmp_path / "env", name="pg-env", version="2.0.0")
    home = {**os.environ, "ENVHUB_HOME": str(tmp_path / "home")}
    out = run_cli("publish", str(env), "--no-audit", "--registry", pg_server.url, "--token",
                  pg_server.tokens["bob"], env=home)
    assert out.returncode == 0 and "bob/pg-env@2.0.0" in out.stdout, out.stderr
    out = run_cli("install", "bob/pg-env@latest", "--registry", pg_server.url, env=home)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "home" / "envs" / "bob" / "pg-env" / "2.0.0" / "env.py").is_file()
    hits = httpx.get(f"{pg_server.url}{API}/search", params={"q": "PG-E"}).json()["hits"]
    assert [h["name"] for h in hits] == ["pg-env"]
    # Strings PostgreSQL would choke on are refused as 4xx, never a 5xx.
    r = httpx.get(f"{pg_server.url}{API}/search", params={"q": "a\x00b"})
    assert r.status_code == 400


def test_concurrent_publish_on_postgres(pg_server: Server, tmp_path: Path) -> None:
    archives = []
    for who in ("a", "b"):
        env = make_env(tmp_path / who, name="pg-race", body=f"    WHO = '{who}'\n")
        archives.append(pack(env, tmp_path / f"dist-{who}").path.read_bytes())
    headers = {"Authorization": f"Bearer {pg_server.tokens['alice']}",
               "Content-Type": "application/gzip"}
    before = tree(pg_server.blobs)

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=pg_server.url + API, headers=headers,
                                     timeout=60) as client:
            return await asyncio.gather(*(
                client.put("/packages/alice/pg-race/versions/1.2.0", content=data)
                for data in archives))

    responses = asyncio.run(both())
    assert sorted(r.status_code for r in responses) == [201, 409]
    versions = httpx.get(f"{pg_server.url}{API}/packages/alice/pg-race").json()["versions"]
    assert len(versions) == 1
    assert len(tree(pg_server.blobs) - before) <= 3  # one blob (+ its two folders at most)


def test_the_audit_queue_on_postgres_gives_each_job_to_one_worker(
        pg_server: Server, postgres_url: str, tmp_path: Path) -> None:
    """The registry's audit queue (the conditional updates of Catalog.claim_job) on a shared
    PostgreSQL: four workers, each with its own connection, claim at once; every queued
    version is taken exactly once. A lease that lapsed is taken again, and the worker that lost
    it can neither renew nor finish it."""
    import threading

    from envhub.registry.catalog import Catalog
    from envhub.registry.models import not_audited

    for i in range(8):
        env = make_env(tmp_path / f"q{i}", name="pg-queue", version=f"1.0.{i}")
        out = run_cli("publish", str(env), "--no-audit", "--registry", pg_server.url,
                      "--token", pg_server.tokens["alice"], "--owner", "alice")
        assert out.returncode == 0, out.stderr
    claimed: dict[str, list[str]] = {}
    start = threading.Barrier(4)

    def work(worker: str) -> None:
        catalog = Catalog(pg_server.data, postgres_url)
        try:
            start.wait()
            while (job := catalog.claim_job(worker, lease_s=600, max_attempts=3)) is not None:
                claimed.setdefault(f"{job.owner}/{job.name}@{job.version}", []).append(worker)
        finally:
            catalog.close()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    mine = {ref: who for ref, who in claimed.items() if "/pg-queue@" in ref}
    assert sorted(mine) == [f"alice/pg-queue@1.0.{i}" for i in range(8)], claimed
    assert all(len(who) == 1 for who in mine.values()), mine  # never given twice

    # a lapsed lease: another worker takes the job, the first one has lost it
    env = make_env(tmp_path / "lapsed", name="pg-queue", version="2.0.0")
    assert run_cli("publish", str(env), "--no-audit", "--registry", pg_server.url, "--token",
                   pg_server.tokens["alice"], "--owner", "alice").returncode == 0
    catalog = Catalog(pg_server.data, postgres_url)
    try:
        first = catalog.claim_job("dead", lease_s=-1, max_attempts=3)  # lapsed at once
        assert first is not None and first.version == "2.0.0" and first.attempt == 1
        again = catalog.claim_job("alive", lease_s=600, max_attempts=3)
        assert again is not None and again.version == "2.0.0" and again.attempt == 2
        assert not catalog.renew_job(first, "dead", 600)
        assert not catalog.finish_job(first, "dead", not_audited("test"), "{}")
        assert catalog.renew_job(again, "alive", 600)
    finally:
        catalog.close()
