"""What one publisher may take from a registry (`envhub registry serve --owner-quota-mb
--uploads-per-hour`), on a real server: an owner's stored archives stop at the quota (413
quota_exceeded naming it; a re-publish of what is stored still passes, other owners are not
affected), and a token's uploads stop at the hourly limit before the body is read (429 with
Retry-After; another token is not affected). A refused upload leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from envhub.registry.limits import UploadWindow
from tests.registry.conftest import API, Server, put, start_server, stop_server, tree
from tests.registry.test_server import packed_bytes


def publish(server: Server, owner: str, data: bytes, name: str, version: str) -> httpx.Response:
    return put(server, f"/packages/{owner}/{name}/versions/{version}", data,
               server.tokens[owner])


def test_an_owners_stored_packages_stop_at_the_quota(tmp_path: Path) -> None:
    # a few KiB each (incompressible padding): the quota's flag counts in MB, at least 0.001
    packages = [packed_bytes(tmp_path, "quota-env", f"1.0.{i}",
                             body=f"# {os.urandom(2048).hex()}\n") for i in range(4)]
    quota = sum(len(p) for p in packages[:3])  # room for three
    flag = str(quota / (1 << 20))
    server = start_server(tmp_path / "data", None, 1.0, "--owner-quota-mb", flag)
    try:
        for i, data in enumerate(packages[:3]):
            assert publish(server, "alice", data, "quota-env", f"1.0.{i}").status_code == 201
        blobs = tree(server.blobs)
        refused = publish(server, "alice", packages[3], "quota-env", "1.0.3")
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded", error
        assert f"quota of {int(float(flag) * (1 << 20))} bytes per owner" in error["message"]
        # nothing kept of the refused one
        assert tree(server.blobs) == blobs
        missing = httpx.get(f"{server.url}{API}/packages/alice/quota-env/versions/1.0.3")
        assert missing.status_code == 404
        # the same content again stores nothing: still 200; another owner has its own quota
        assert publish(server, "alice", packages[0], "quota-env", "1.0.0").status_code == 200
        other = packed_bytes(tmp_path, "bobs-env", "1.0.0")
        assert publish(server, "bob", other, "bobs-env", "1.0.0").status_code == 201
    finally:
        stop_server(server)


def test_a_tokens_uploads_stop_at_the_hourly_limit_before_the_body(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", None, 1.0, "--uploads-per-hour", "3")
    try:
        # three starts, whatever they end as (a bad archive costs the server a scan too)
        assert publish(server, "alice", packed_bytes(tmp_path, "rate-env", "1.0.0"),
                       "rate-env", "1.0.0").status_code == 201
        assert publish(server, "alice", b"not a tar", "rate-env", "1.0.1").status_code == 422
        assert publish(server, "alice", packed_bytes(tmp_path, "rate-env", "1.0.2"),
                       "rate-env", "1.0.2").status_code == 201
        blobs = tree(server.blobs)
        refused = publish(server, "alice", packed_bytes(tmp_path, "rate-env", "1.0.3"),
                          "rate-env", "1.0.3")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limited"
        assert "3 uploads in the last hour" in refused.json()["error"]["message"]
        assert 0 < int(refused.headers["Retry-After"]) <= 3600
        assert tree(server.blobs) == blobs
        # refused before the body is read: a body far over the upload limit gets 429, not 413
        flood = put(server, "/packages/alice/rate-env/versions/1.0.4", b"x" * (3 << 20),
                    server.tokens["alice"])
        assert flood.status_code == 429, flood.text
        # another token is counted on its own
        assert publish(server, "bob", packed_bytes(tmp_path, "bobs-env", "1.0.0"),
                       "bobs-env", "1.0.0").status_code == 201
    finally:
        stop_server(server)


def test_the_window_frees_a_start_an_hour_after_it() -> None:
    now = [1000.0]
    window = UploadWindow(2, clock=lambda: now[0])
    assert window.admit("t") is None
    now[0] = 1100.0
    assert window.admit("t") is None
    assert window.admit("t") == 3500  # the start at 1000 leaves at 4600
    assert window.admit("u") is None  # another token
    now[0] = 4600.5
    assert window.admit("t") is None  # the start at 1000 is over an hour old
    assert window.admit("t") == 100  # the one at 1100 leaves in 99.5 s
