"""A hub whose audits are run by the hub (registry/verify.py) and whose records are signed
(registry/signing.py): a real registry server, real `envhub registry worker` processes running
the real `envhub audit` in their bubblewrap jail, and `envhub install` as a user runs it.

One registry for the module, the story in order:
1. published: an honest package (`envhub init`, no audit of its own: `pending`) and a
   deliberately hackable one with a forged passing audit header (`claimed`);
2. a worker takes the honest one and is killed mid-audit: it is not shown verified;
3. a second worker drains the queue: the honest package is taken again and `verified`, the
   hackable one `flagged`;
4. a package whose audit hangs and a hostile one (it probes the network and the registry's
   files from its own code) are published; a third worker cuts the hang at its time limit
   (`failed`) and goes on to the hostile one (`failed`, with what its probe saw: nothing);
5. installs check what was signed: `--require verified`, a changed blob, an edited record,
   a record replayed from another version, a registry that changed its key.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from envhub.registry.archive import pack
from tests.envs.test_audit import hackable_env
from tests.registry.conftest import API, Server, run_cli, start_server, stop_server
from tests.registry.test_publish_audit import audit_json
from tests.support import require_tool, until

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]

# The rest of the Environment protocol, for the packages below that fail or hang before it
STUBS = '''
    async def setup(self, task, ctx):
        return await ctx.open_sandbox(self.manifest.sandbox)

    def tools(self, task):
        return []

    async def solve(self, task, sandbox, ctx):
        pass

    async def verify(self, task, sandbox, ctx):
        raise NotImplementedError
'''
# Its own code, run by the audit: what can it reach? It says so in the error that ends the audit.
PROBE_ENV = '''"""A hostile package: its load_tasks probes what the audit process can reach."""

import os
import socket


def probe(port, paths):
    seen = []
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        seen.append("registry-port=open")
    except OSError as e:
        seen.append("registry-port=" + type(e).__name__)
    for name, path in paths.items():
        seen.append(name + ("=readable" if os.path.exists(path) else "=hidden"))
    return "FINDINGS " + " ".join(seen)


def undo(paths):
    """Unmount what hides each path's folder (as root with its capabilities, which a jail
    run by root keeps, this reveals it) and remount / read-write: the count that worked."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    done = 0
    for path in paths.values():
        for _ in range(3):  # each mount stacked there
            done += libc.umount2(os.path.dirname(path).encode(), 2) == 0  # MNT_DETACH
    done += libc.mount(b"none", b"/", None, 0x20 | 0x1000 | 0x4000, None) == 0  # rw remount
    return done


class Environment:
    def __init__(self, folder, manifest):
        self.folder, self.manifest = folder, manifest

    def load_tasks(self):
        # the report the worker reads, made a link to the registry's key (were it visible)
        os.symlink(PATHS["key"], "report.json")
        undone = undo(PATHS)
        raise RuntimeError(probe(PORT, PATHS) + " undone=" + str(undone))
''' + STUBS
FORGER_ENV = '''"""A package that writes the audit's report itself, claiming a pass."""

import json


class Environment:
    def __init__(self, folder, manifest):
        self.folder, self.manifest = folder, manifest

    def load_tasks(self):
        with open("report.json", "w") as f:
            json.dump({"flagged": False, "rows": [{"cheat": "x", "sandbox": "local"}]}, f)
        raise SystemExit(0)
''' + STUBS
HANGING_ENV = '''"""A package whose audit hangs: its load_tasks never returns."""

import time


class Environment:
    def __init__(self, folder, manifest):
        self.folder, self.manifest = folder, manifest

    def load_tasks(self):
        while True:
            time.sleep(60)
''' + STUBS


def init_package(root: Path, name: str, env_py: str | None = None) -> Path:
    """`envhub init NAME` (local sandboxes), its env.py replaced when given."""
    made = run_cli("init", str(root / name))
    assert made.returncode == 0, made.stderr
    manifest = root / name / "envhub.toml"
    manifest.write_text(manifest.read_text().replace('kind = "auto"', 'kind = "local"', 1))
    if env_py is not None:
        (root / name / "env.py").write_text(env_py)
    return root / name


def publish(server: Server, folder: Path, *args: str) -> None:
    out = run_cli("publish", str(folder), "--registry", server.url, "--token",
                  server.tokens["alice"], "--owner", "alice", *args)
    assert out.returncode == 0, out.stderr[-2000:]


def version(server: Server, name: str) -> dict[str, Any]:
    r = httpx.get(f"{server.url}{API}/packages/alice/{name}/versions/0.1.0", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def install(server: Server, home: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENVHUB_HOME": str(home)}
    for var in ("ENVHUB_REGISTRY", "ENVHUB_TOKEN", "ENVHUB_REQUIRE", "ENVHUB_REGISTRY_KEY"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "envhub", "install", f"alice/{name}@0.1.0",
                           "--registry", server.url, "--force", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def worker(server: Server, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "envhub", "registry", "worker", "--data",
                             str(server.data), "--tasks", "1", "--cheat-timeout", "120",
                             *args], start_new_session=True)


def job(server: Server, name: str) -> tuple[str, int]:
    with sqlite3.connect(server.data / "index.db") as db:
        return db.execute("SELECT state, attempts FROM audit_jobs WHERE name = ?",
                          (name,)).fetchone()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_tool("bwrap")
    root = tmp_path_factory.mktemp("hub")
    server = start_server(root / "data", max_upload_mb=5)
    seen: dict[str, Any] = {"server": server, "root": root}
    try:
        honest = init_package(root, "honest")
        publish(server, honest, "--no-audit")
        hackable = hackable_env(root / "hackable")  # trusts a state.json the agent writes
        forged = audit_json(root / "forged.json", pack(hackable, root / "dist").digest,
                            name="hackable", version="0.1.0")
        publish(server, hackable, "--audit", str(forged))
        seen["before"] = {n: version(server, n) for n in ("honest", "hackable")}
        seen["index_before"] = httpx.get(f"{server.url}/ui/alice/hackable", timeout=30).text
        seen["install_claimed"] = install(server, root / "u1", "hackable")
        seen["require_claimed"] = install(server, root / "u2", "hackable", "--require",
                                          "verified")
        seen["require_pending"] = install(server, root / "u3", "honest", "--require",
                                          "verified")
        # a worker dies mid-audit of the honest package
        first = worker(server, "--lease", "4")
        assert until(lambda: job(server, "honest") == ("running", 1), 120), job(server, "honest")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        seen["after_death"] = version(server, "honest")
        seen["after_death_job"] = job(server, "honest")
        second = worker(server, "--lease", "4", "--once")
        assert second.wait(900) == 0
        # a package whose audit hangs, then a hostile one: the hang is cut at the worker's
        # limit and the next job runs
        hanging = init_package(root, "hanging", HANGING_ENV)
        publish(server, hanging, "--no-audit")
        probe = init_package(root, "probe", PROBE_ENV.replace("PORT", str(
            server.url.rsplit(":", 1)[1])).replace("PATHS", repr({
                "index": str(server.data / "index.db"),
                "key": str(server.data / "signing.key"),
                "blobs": str(server.data / "blobs")})))
        publish(server, probe, "--no-audit")
        forger = init_package(root, "forger", FORGER_ENV)
        publish(server, forger, "--no-audit")
        third = worker(server, "--lease", "4", "--job-timeout", "45", "--once")
        assert third.wait(900) == 0
        names = ("honest", "hackable", "probe", "hanging", "forger")
        seen["after"] = {n: version(server, n) for n in names}
        seen["jobs"] = {n: job(server, n) for n in names}
        yield seen
    finally:
        stop_server(server)


def test_a_forged_claim_is_claimed_until_the_registrys_audit_flags_it(hub: dict[str, Any]):
    claimed = hub["before"]["hackable"]
    assert claimed["audit"]["status"] == "passed"  # the publisher's forged header
    assert claimed["verification"]["status"] == "claimed", claimed["verification"]
    assert "CLAIMED" in hub["index_before"] and "VERIFIED" not in hub["index_before"]
    assert hub["before"]["honest"]["verification"]["status"] == "pending"
    out = hub["install_claimed"]
    assert out.returncode == 0 and "registry's audit: claimed" in out.stdout, out.stdout
    for name in ("require_claimed", "require_pending"):
        refused = hub[name]
        assert refused.returncode == 2 and "verified is required" in refused.stderr, refused
    flagged = hub["after"]["hackable"]["verification"]
    assert flagged["status"] == "flagged" and flagged["record"] is not None, flagged
    assert any("write-artifacts" in f for f in flagged["summary"]["flagged"]), flagged
    index = httpx.get(f"{hub['server'].url}/ui/alice/hackable", timeout=30).text
    assert "FLAGGED by this registry" in index, index[:3000]
    root = hub["root"]
    shown = install(hub["server"], root / "u4", "hackable")
    assert shown.returncode == 0 and "registry's audit: flagged" in shown.stdout, shown
    assert "FLAGGED" in shown.stderr
    refused = install(hub["server"], root / "u5", "hackable", "--require", "verified")
    assert refused.returncode == 2 and "flagged" in refused.stderr, refused.stderr


def test_an_honest_package_is_verified_after_its_worker_died_mid_audit(hub: dict[str, Any]):
    # while the killed worker's lease ran, nothing said verified
    assert hub["after_death"]["verification"]["status"] == "pending", hub["after_death"]
    assert hub["after_death_job"] == ("running", 1)
    honest = hub["after"]["honest"]["verification"]
    assert honest["status"] == "verified" and honest["attempts"] == 2, honest
    assert honest["summary"]["sandboxes"] == ["local"] and honest["summary"]["rows"] > 10
    server = hub["server"]
    report = httpx.get(f"{server.url}{API}/packages/alice/honest/versions/0.1.0/audit",
                       headers={"Authorization": f"Bearer {server.tokens['alice']}"},
                       timeout=30)
    assert report.status_code == 200 and not report.json()["flagged"], report.text[:500]
    assert len(report.json()["rows"]) == honest["summary"]["rows"]  # the full report
    ok = install(server, hub["root"] / "u6", "honest", "--require", "verified")
    assert ok.returncode == 0 and "registry's audit: verified" in ok.stdout, ok.stderr


def test_a_hostile_package_reaches_nothing_and_a_hanging_one_does_not_stall_the_queue(
        hub: dict[str, Any]):
    probe = hub["after"]["probe"]["verification"]
    assert probe["status"] == "failed" and "without a report" in probe["error"], probe
    server = hub["server"]
    report = httpx.get(f"{server.url}{API}/packages/alice/probe/versions/0.1.0/audit",
                       headers={"Authorization": f"Bearer {server.tokens['alice']}"},
                       timeout=30).json()  # the owner's: the audit's output is theirs
    findings = report["output_tail"][report["output_tail"].index("FINDINGS"):].split("\n")[0]
    assert "registry-port=ConnectionRefusedError" in findings, findings
    assert "index=hidden" in findings and "key=hidden" in findings, findings
    assert "blobs=hidden" in findings, findings
    # it could not undo the jail: no unmount or remount worked (it runs without capabilities)
    assert "undone=0" in findings, findings
    key = (server.data / "signing.key").read_text()
    public = json.dumps(hub["after"]) + httpx.get(f"{server.url}/", timeout=30).text
    assert key.split("\n")[1] not in public + json.dumps(report)  # the report link: refused
    hanging = hub["after"]["hanging"]["verification"]
    assert hanging["status"] == "failed" and "did not finish within 45 s" in hanging["error"]
    assert hub["jobs"]["hanging"] == ("failed", 1)
    # the package's own report claiming a pass, without the battery's rows: not a verdict
    forger = hub["after"]["forger"]["verification"]
    assert forger["status"] == "failed" and "no no-op, oracle row" in forger["error"], forger
    # the probe is a real probe: on the host, outside the jail, it sees what it looks for
    namespace: dict[str, Any] = {}
    exec(PROBE_ENV.split("class Environment")[0], namespace)  # noqa: S102 - our test's code
    seen = namespace["probe"](int(server.url.rsplit(":", 1)[1]),
                              {"index": str(server.data / "index.db")})
    assert "registry-port=open" in seen and "index=readable" in seen, seen


def test_install_refuses_what_the_registry_did_not_sign(hub: dict[str, Any], tmp_path: Path):
    server = hub["server"]
    db = server.data / "index.db"

    def row(name: str, kind: str) -> tuple[str, str]:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT record, signature FROM signatures WHERE name = ? AND "
                                "kind = ?", (name, kind)).fetchone()

    def put_row(name: str, kind: str, record: str, signature: str) -> None:
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE signatures SET record = ?, signature = ? WHERE name = ? AND "
                         "kind = ?", (record, signature, name, kind))

    def refused(name: str, message: str, *args: str) -> None:
        out = install(server, tmp_path / f"u-{time.monotonic_ns()}", name, *args)
        assert out.returncode == 2 and message in out.stderr, (message, out.stderr[-1500:])

    # a verification record edited in the database: flagged -> verified (valid JSON, the
    # signature of the original)
    record, signature = row("hackable", "verification")
    version_row = row("hackable", "version")
    edited = {**json.loads(record), "status": "verified", "flagged": []}
    put_row("hackable", "verification",
            json.dumps(edited, sort_keys=True, separators=(",", ":")), signature)
    refused("hackable", "does not carry a valid signature")
    put_row("hackable", "verification", record, signature)
    # the honest package's (valid) verification record replayed onto the hackable one
    honest_record, honest_signature = row("honest", "verification")
    put_row("hackable", "verification", honest_record, honest_signature)
    refused("hackable", "not of this version")
    put_row("hackable", "verification", record, signature)
    # a version record of another digest replayed
    put_row("hackable", "version", *row("honest", "version"))
    refused("hackable", "not of this version")
    put_row("hackable", "version", *version_row)
    # the blob changed on the server's disk, and its digest in the index with it
    from envhub.registry.blobs import BlobStore

    blob = BlobStore(server.data / "blobs").path(hub["after"]["honest"]["digest"])
    original = blob.read_bytes()
    blob.write_bytes(original[:-10] + b"\0" * 10)
    refused("honest", "digest")
    blob.write_bytes(original)
    # the registry now signs with another key than the one pinned at the first install (or
    # someone else answers at its address), and one configured that it does not use
    home = tmp_path / "pinned"
    assert install(server, home, "honest").returncode == 0
    pins = json.loads((home / "registry_keys.json").read_text())
    assert pins[server.url]["key"] == httpx.get(f"{server.url}{API}/key").json()["key"]
    pins[server.url]["key"] = "A" * 43 + "="
    (home / "registry_keys.json").write_text(json.dumps(pins))
    again = install(server, home, "honest")
    assert again.returncode == 2 and "now signs with key" in again.stderr, again.stderr
    configured = subprocess.run(
        [sys.executable, "-m", "envhub", "install", "alice/honest@0.1.0", "--registry",
         server.url, "--force"], capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "ENVHUB_HOME": str(tmp_path / "other"),
             "ENVHUB_REGISTRY_KEY": "B" * 43 + "="})
    assert configured.returncode == 2 and "ENVHUB_REGISTRY_KEY" in configured.stderr


def test_a_reaudit_keeps_the_last_verdict_until_the_new_one_lands(hub: dict[str, Any]):
    server = hub["server"]
    # by default: the failed audits and those another envhub ran (none here)
    same = run_cli("registry", "reaudit", "--data", str(server.data))
    assert same.returncode == 0 and "3 version(s) queued" in same.stdout, same
    assert job(server, "hanging") == ("pending", 0) and job(server, "honest")[0] == "done"
    again = run_cli("registry", "reaudit", "--data", str(server.data), "--all")
    assert again.returncode == 0 and "2 version(s) queued" in again.stdout, again
    assert job(server, "honest") == ("pending", 0)
    with sqlite3.connect(server.data / "index.db") as db:
        kept = db.execute("SELECT state, record IS NOT NULL FROM audit_history WHERE name = "
                          "'honest'").fetchall()
    assert kept == [("done", 1)]  # the superseded verdict, with its signed record
    shown = version(server, "honest")["verification"]
    assert shown["status"] == "verified" and shown["record"] is not None, shown
    assert version(server, "hackable")["verification"]["status"] == "flagged"
    ok = install(server, hub["root"] / "u7", "honest", "--require", "verified")
    assert ok.returncode == 0, ok.stderr
    missing = run_cli("registry", "reaudit", "--data", str(hub["root"] / "nowhere"))
    assert missing.returncode == 2 and "no index.db" in missing.stderr
