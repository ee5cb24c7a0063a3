"""Publisher keys on a real registry server: an owner whose key the operator registered
(`envhub registry keygen`, `envhub registry publisher-key`) publishes only uploads signed with
it (`envhub publish --sign KEY`); `envhub install` checks that signature with the owner's key
as this machine first saw it, and refuses a signature edited in the registry's database, one
copied from another version, and an owner key replaced on the registry after first use."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx

from tests.registry.conftest import API, Server, make_env, run_cli, start_server, stop_server


def publish(server: Server, folder: Path, owner: str, *args: str
            ) -> subprocess.CompletedProcess[str]:
    return run_cli("publish", str(folder), "--registry", server.url, "--token",
                   server.tokens[owner], "--owner", owner, "--no-audit", *args)


def install(server: Server, home: Path, ref: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENVHUB_HOME": str(home)}
    for var in ("ENVHUB_REGISTRY", "ENVHUB_TOKEN", "ENVHUB_REQUIRE", "ENVHUB_REGISTRY_KEY"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "envhub", "install", ref, "--registry",
                           server.url, "--force"], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_an_owner_with_a_key_publishes_only_signed_uploads_and_installs_check_them(
        tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        keys = tmp_path / "keys"
        keys.mkdir()
        made = run_cli("registry", "keygen", "--out", str(keys / "alice.key"))
        assert made.returncode == 0, made.stderr
        assert (keys / "alice.key").stat().st_mode & 0o777 == 0o600
        assert run_cli("registry", "keygen", "--out", str(keys / "alice.key")).returncode == 2
        assert run_cli("registry", "keygen", "--out", str(keys / "mallory.key")).returncode == 0
        bad = run_cli("registry", "publisher-key", "--owner", "alice", "--key", "not-a-key",
                      "--data", str(server.data))
        assert bad.returncode == 2 and "not an ed25519 public key" in bad.stderr
        registered = run_cli("registry", "publisher-key", "--owner", "alice", "--key",
                             str(keys / "alice.key.pub"), "--data", str(server.data))
        assert registered.returncode == 0, registered.stderr
        served = httpx.get(f"{server.url}{API}/owners/alice/key", timeout=30)
        assert served.status_code == 200
        assert served.json()["key"] == (keys / "alice.key.pub").read_text().strip()
        assert httpx.get(f"{server.url}{API}/owners/bob/key", timeout=30).status_code == 404

        one = make_env(tmp_path / "signed-env", name="signed-env", version="1.0.0")
        unsigned = publish(server, one, "alice")
        assert unsigned.returncode == 2
        assert "owner alice signs its uploads" in unsigned.stderr and "--sign" in unsigned.stderr
        forged = publish(server, one, "alice", "--sign", str(keys / "mallory.key"))
        assert forged.returncode == 2
        assert "does not verify with alice's publisher key" in forged.stderr
        assert publish(server, one, "alice", "--sign", str(keys / "alice.key")).returncode == 0
        two = make_env(tmp_path / "signed-env-2", name="signed-env", version="1.0.1")
        assert publish(server, two, "alice", "--sign", str(keys / "alice.key")).returncode == 0
        # bob has no key: unsigned is fine, a signature is a clear error
        bobs = make_env(tmp_path / "bobs-env", name="bobs-env", version="1.0.0")
        signed_by_bob = publish(server, bobs, "bob", "--sign", str(keys / "mallory.key"))
        assert signed_by_bob.returncode == 2 and "has no publisher key" in signed_by_bob.stderr
        assert publish(server, bobs, "bob").returncode == 0

        home = tmp_path / "home"
        ok = install(server, home, "alice/signed-env@1.0.0")
        assert ok.returncode == 0, ok.stderr
        kid = served.json()["key_id"]
        assert f"signed by its publisher: {kid}" in ok.stdout
        assert "signed by its publisher" not in install(server, home, "bob/bobs-env@1.0.0").stdout

        # a signature copied from another version in the registry's database
        with sqlite3.connect(server.data / "index.db") as db:
            rows = dict(db.execute("SELECT version, signature FROM signatures WHERE "
                                   "kind = 'publisher' AND name = 'signed-env'").fetchall())
            record = db.execute("SELECT record FROM signatures WHERE kind = 'publisher' AND "
                                "version = '1.0.1'").fetchone()[0]
            db.execute("UPDATE signatures SET record = ?, signature = ? WHERE kind = "
                       "'publisher' AND version = '1.0.0'", (record, rows["1.0.1"]))
        replayed = install(server, home, "alice/signed-env@1.0.0")
        assert replayed.returncode == 2
        assert "signature copied from another version" in replayed.stderr, replayed.stderr
        # the signature itself edited
        with sqlite3.connect(server.data / "index.db") as db:
            db.execute("UPDATE signatures SET signature = ? WHERE kind = 'publisher' AND "
                       "version = '1.0.1'", (rows["1.0.0"],))
        edited = install(server, home, "alice/signed-env@1.0.1")
        assert edited.returncode == 2, edited.stderr
        assert "not carry a valid signature of owner alice's key" in edited.stderr, edited.stderr

        # the owner's key replaced on the registry after this machine first saw it
        swapped = run_cli("registry", "publisher-key", "--owner", "alice", "--key",
                          str(keys / "mallory.key.pub"), "--data", str(server.data))
        assert swapped.returncode == 0
        three = make_env(tmp_path / "signed-env-3", name="signed-env", version="1.0.2")
        assert publish(server, three, "alice", "--sign", str(keys / "mallory.key")
                       ).returncode == 0
        refused = install(server, home, "alice/signed-env@1.0.2")
        assert refused.returncode == 2
        assert "owner's key was replaced on the registry" in refused.stderr, refused.stderr
        # another machine, which never saw the first key, takes the new one
        assert install(server, tmp_path / "home2", "alice/signed-env@1.0.2").returncode == 0
    finally:
        stop_server(server)
