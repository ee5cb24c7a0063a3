"""The HTTP registry as a real `envhub registry serve` process on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from envhub.registry.archive import pack
from envhub.registry.install import resolve
from tests.registry.conftest import API, ENVHUB, Server, make_env, put, run_cli, tree
from tests.registry.hostile import HOSTILE


def packed_bytes(tmp_path: Path, name: str, version: str = "1.0.0", body: str = "") -> bytes:
    env = make_env(tmp_path / f"{name}-{version}-{abs(hash(body))}", name=name,
                   version=version, body=body)
    return pack(env, tmp_path / "dist" / f"{abs(hash(body))}").path.read_bytes()


def test_round_trip_through_the_cli(server: Server, tmp_path: Path) -> None:
    """init → pack → publish → login → search → install, each a real `envhub` process."""
    client_env = {**os.environ, "ENVHUB_HOME": str(tmp_path / "home")}
    for var in ("ENVHUB_REGISTRY", "ENVHUB_TOKEN"):
        client_env.pop(var, None)
    out = subprocess.run([*ENVHUB, "init", "my-env"], cwd=tmp_path, env=client_env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    env = tmp_path / "my-env"
    text = (env / "envhub.toml").read_text()
    (env / "envhub.toml").write_text(text.replace('version = "0.1.0"', 'version = "1.2.0"'))
    out = run_cli("pack", str(env), env=client_env)
    assert out.returncode == 0, out.stderr
    digest = out.stdout.split()[1]

    out = run_cli("publish", str(env / "dist" / "my-env-1.2.0.tar.gz"), "--no-audit", "--registry",
                  server.url, "--token", server.tokens["alice"], env=client_env)
    assert out.returncode == 0, out.stderr
    assert f"alice/my-env@1.2.0 published to {server.url}\n{digest}" in out.stdout

    out = run_cli("login", server.url, "--token", server.tokens["alice"], env=client_env)
    assert out.returncode == 0 and "as alice" in out.stdout, out.stderr
    creds = tmp_path / "home" / "credentials.json"
    assert creds.stat().st_mode & 0o777 == 0o600

    out = run_cli("search", "my-env", "--json", env=client_env)
    assert out.returncode == 0 and '"name": "my-env"' in out.stdout, out.stderr
    out = run_cli("install", "alice/my-env@1.2.0", env=client_env)
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "home" / "envs" / "alice" / "my-env" / "1.2.0"
    assert (folder / "env.py").read_text() == (env / "env.py").read_text()

    # Same content again: idempotent (200); the CLI says so.
    out = run_cli("publish", str(env), "--no-audit", env=client_env)  # token + registry from login
    assert out.returncode == 0 and "already published" in out.stdout, out.stderr
    # resolve() (for `envhub run`) against the server, in-process.
    assert resolve("alice/my-env@^1.0.0", registry=server.url,
                   home=tmp_path / "home2") == tmp_path / "home2" / "envs/alice/my-env/1.2.0"


def test_auth_and_ownership(server: Server, tmp_path: Path) -> None:
    data = packed_bytes(tmp_path, "owned")
    before = tree(server.data)
    path = "/packages/alice/owned/versions/1.0.0"
    r = put(server, path, data, token=None)
    assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]["message"]
    r = put(server, path, data, token="ehr_not-a-real-token")
    assert r.status_code == 401 and "unknown token" in r.json()["error"]["message"]
    r = put(server, path, data, token=None, headers={"Authorization": "Basic YWxpY2U6eA=="})
    assert r.status_code == 401
    r = put(server, path, data, token=server.tokens["bob"])
    assert r.status_code == 403 and "only for bob" in r.json()["error"]["message"]
    assert tree(server.data) - before <= {"index.db-journal"}
    assert httpx.get(f"{server.url}{API}/packages/alice/owned").status_code == 404
    r = httpx.post(f"{server.url}{API}/packages/alice/owned/versions/1.0.0/yank",
                   json={"yanked": True},
                   headers={"Authorization": f"Bearer {server.tokens['bob']}"})
    assert r.status_code == 403


def test_immutable_versions(server: Server, tmp_path: Path) -> None:
    first = packed_bytes(tmp_path, "immut", body="    A = 1\n")
    second = packed_bytes(tmp_path, "immut", body="    A = 2\n")
    path = "/packages/alice/immut/versions/1.0.0"
    assert put(server, path, first, server.tokens["alice"]).status_code == 201
    assert put(server, path, first, server.tokens["alice"]).status_code == 200
    before = tree(server.blobs)
    r = put(server, path, second, server.tokens["alice"])
    assert r.status_code == 409 and "immutable" in r.json()["error"]["message"]
    assert tree(server.blobs) == before
    info = httpx.get(f"{server.url}{API}/packages/alice/immut/versions/1.0.0").json()
    assert info["digest"] == "sha256:" + hashlib.sha256(first).hexdigest()


def test_concurrent_publishes_of_one_version(server: Server, tmp_path: Path) -> None:
    a = packed_bytes(tmp_path, "race", body="    WHO = 'a'\n")
    b = packed_bytes(tmp_path, "race", body="    WHO = 'b'\n")
    headers = {"Authorization": f"Bearer {server.tokens['alice']}",
               "Content-Type": "application/gzip"}

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url + API, headers=headers,
                                     timeout=60) as client:
            return await asyncio.gather(
                client.put("/packages/alice/race/versions/1.0.0", content=a),
                client.put("/packages/alice/race/versions/1.0.0", content=b))

    responses = asyncio.run(both())
    # No pre-check in the server: the unique (owner, name, version) constraint decides.
    assert sorted(r.status_code for r in responses) == [201, 409]
    stored = httpx.get(f"{server.url}{API}/packages/alice/race").json()["versions"]
    assert len(stored) == 1
    winner = next(r for r in responses if r.status_code < 300).json()["version"]["digest"]
    assert stored[0]["digest"] == winner
    # Only the winner's blob exists.
    hexd = winner.split(":")[1]
    blobs = {p.name for p in server.blobs.rglob("*") if p.is_file()}
    assert hexd in blobs
    for other in (a, b):
        h = hashlib.sha256(other).hexdigest()
        assert (h in blobs) == (h == hexd)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_uploads_are_refused(server: Server, case: str) -> None:
    data = HOSTILE[case]()
    before = tree(server.blobs)
    r = put(server, "/packages/alice/my-env/versions/1.2.0", data, server.tokens["alice"])
    assert r.status_code in (413, 422), r.text
    assert r.json()["error"]["code"] in ("bad_package", "too_large")
    assert tree(server.blobs) == before


def test_upload_checks(server: Server, tmp_path: Path) -> None:
    data = packed_bytes(tmp_path, "checked")
    tok = server.tokens["alice"]
    before = tree(server.blobs)
    r = put(server, "/packages/alice/checked/versions/1.0.0", data, tok,
            headers={"X-Envhub-Digest": "sha256:" + "0" * 64})
    assert r.status_code == 422 and r.json()["error"]["code"] == "digest_mismatch"
    r = put(server, "/packages/alice/checked/versions/2.0.0", data, tok)
    assert r.status_code == 422 and "says checked@1.0.0" in r.json()["error"]["message"]
    r = put(server, "/packages/alice/other-name/versions/1.0.0", data, tok)
    assert r.status_code == 422
    r = put(server, "/packages/alice/checked/versions/1.0", data, tok)
    assert r.status_code == 422 and "version" in r.json()["error"]["message"]
    r = put(server, "/packages/Alice!/checked/versions/1.0.0", data, tok)
    assert r.status_code == 422 and "owner" in r.json()["error"]["message"]
    r = put(server, "/packages/alice/checked/versions/1.0.0", b"", tok)
    assert r.status_code == 400 and "empty" in r.json()["error"]["message"]
    assert tree(server.blobs) == before


def _raw_request(server: Server, head: str, body: bytes) -> str:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head.encode() + body)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and b"}" in chunk:
                break
    return b"".join(chunks).decode(errors="replace")


def test_oversized_upload_gets_413_before_the_body_is_read(server: Server) -> None:
    before = tree(server.blobs)
    tok = server.tokens["alice"]
    # Claims 10 GB but sends 1 KiB: an answer at all proves the server did not read it all.
    head = (f"PUT {API}/packages/alice/huge/versions/1.0.0 HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {tok}\r\nContent-Type: application/gzip\r\n"
            "Content-Length: 10000000000\r\n\r\n")
    reply = _raw_request(server, head, b"\0" * 1024)
    assert reply.startswith("HTTP/1.1 413"), reply[:200]
    assert "too_large" in reply
    # Chunked (no Content-Length): counted while streaming, refused once over 1 MiB.
    head = (f"PUT {API}/packages/alice/huge/versions/1.0.0 HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {tok}\r\nContent-Type: application/gzip\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"\0" * 65536
    body = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(20))
    reply = _raw_request(server, head, body)
    assert reply.startswith("HTTP/1.1 413"), reply[:200]
    assert tree(server.blobs) == before


def test_tampered_blob_is_refused_at_install(server: Server, tmp_path: Path) -> None:
    data = packed_bytes(tmp_path, "tampered")
    assert put(server, "/packages/alice/tampered/versions/1.0.0", data,
               server.tokens["alice"]).status_code == 201
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    hexd = digest.split(":")[1]
    blob = server.blobs / "sha256" / hexd[:2] / hexd
    blob.write_bytes(data[:-4] + bytes(b ^ 0xFF for b in data[-4:]))  # same size, new bytes
    home = tmp_path / "client-home"
    home.mkdir()
    env = {**os.environ, "ENVHUB_HOME": str(home)}
    out = run_cli("install", "alice/tampered@1.0.0", "--registry", server.url, env=env)
    assert out.returncode == 2
    assert "tampered with" in out.stderr
    assert tree(home) == set()


def test_errors_use_the_api_shape(server: Server) -> None:
    r = httpx.get(f"{server.url}{API}/packages/alice/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(f"{server.url}{API}/no/such/route")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(f"{server.url}{API}/search", params={"limit": 1000})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    r = httpx.get(f"{server.url}{API}/blobs/md5:abc")
    assert r.status_code == 422 and "sha256:" in r.json()["error"]["message"]
    r = httpx.get(f"{server.url}{API}/packages/alice/my-env/resolve", params={"spec": ">>1"})
    assert r.status_code == 400 and "range" in r.json()["error"]["message"]
    spec = httpx.get(f"{server.url}/openapi.json").json()
    assert f"{API}/packages/{{owner}}/{{name}}/versions/{{version}}" in spec["paths"]
