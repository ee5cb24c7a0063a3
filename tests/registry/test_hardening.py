"""Hostile packages and requests that used to get a 500, an uninstallable package or a huge
answer: deep nesting, over-long names, giant descriptions. A real registry on loopback."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import httpx
import pytest

from envhub.registry.catalog import Catalog
from envhub.registry.limits import SEARCH_DESCRIPTION_CHARS, Limits
from tests.registry.conftest import API, Server, put, run_cli, tree
from tests.registry.hostile import build, member


def manifest(name: str, extra: str = "") -> bytes:
    return (f'name = "{name}"\nversion = "1.0.0"\nentrypoint = "env:TinyEnv"\n'
            f"{extra}").encode()


DEEP = {
    "arrays": "[metadata]\nx = " + "[" * 5000 + "]" * 5000 + "\n",
    "inline tables": "[metadata]\nx = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n",
    "dotted keys": "[metadata]\n" + ".".join(["a"] * 5000) + " = 1\n",
    "table headers": "[" + ".".join(["metadata"] * 5000) + "]\nz = 1\n",
}


@pytest.mark.parametrize("case", sorted(DEEP))
def test_deeply_nested_manifest_is_a_4xx(server: Server, case: str) -> None:
    before = tree(server.blobs)
    r = put(server, "/packages/alice/deep/versions/1.0.0",
            build([], manifest=manifest("deep", DEEP[case])), server.tokens["alice"])
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "bad_package"
    assert "nested" in r.json()["error"]["message"]
    assert tree(server.blobs) == before


def test_deeply_nested_json_body_is_a_4xx(server: Server) -> None:
    """FastAPI answers 400 to a body its decoder cannot read (RecursionError included)."""
    body = '{"yanked": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = httpx.post(f"{server.url}{API}/packages/alice/deep/versions/1.0.0/yank",
                   content=body, headers={"Authorization": f"Bearer {server.tokens['alice']}",
                                          "Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert "error" in r.json()


LONG = {
    "300-byte file name (GNU)": (tarfile.GNU_FORMAT, "data/" + "n" * 300 + ".txt",
                                 "file or folder name of 304 bytes, over the 255-byte limit"),
    "300-byte file name (PAX)": (tarfile.PAX_FORMAT, "x" * 300, "name of 300 bytes"),
    "256-byte folder name": (tarfile.GNU_FORMAT, "d" * 256 + "/f.txt", "name of 256 bytes"),
    "255 two-byte characters": (tarfile.PAX_FORMAT, "é" * 200, "name of 400 bytes"),
    "1100-byte path": (tarfile.GNU_FORMAT, "/".join(["p" * 100] * 11),
                       "path of 1110 bytes, over the 1024-byte limit"),
}


@pytest.mark.parametrize("case", sorted(LONG))
def test_over_long_names_are_refused_at_publish(server: Server, case: str) -> None:
    fmt, name, message = LONG[case]
    before = tree(server.blobs)
    r = put(server, "/packages/alice/long/versions/1.0.0",
            build([member(name)], manifest=manifest("long"), fmt=fmt), server.tokens["alice"])
    assert r.status_code == 422, r.text
    assert message in r.json()["error"]["message"]
    assert len(r.json()["error"]["message"]) < 400  # the name is cut, not echoed whole
    assert tree(server.blobs) == before


def test_names_at_the_limits_publish_and_install(server: Server, tmp_path: Path) -> None:
    name = "data/" + "n" * 251 + ".txt"  # a 255-byte component
    data = build([member(name, data=b"ok")], manifest=manifest("edge"), fmt=tarfile.GNU_FORMAT)
    r = put(server, "/packages/alice/edge/versions/1.0.0", data, server.tokens["alice"])
    assert r.status_code == 201, r.text
    home = tmp_path / "home"
    home.mkdir()
    out = run_cli("install", "alice/edge@1.0.0", "--registry", server.url,
                  env={**os.environ, "ENVHUB_HOME": str(home)})
    assert out.returncode == 0, out.stderr
    assert [p.read_bytes() for p in home.rglob("n" * 251 + ".txt")] == [b"ok"]


def test_a_package_published_before_the_limits_is_a_clear_install_error(
        server: Server, tmp_path: Path) -> None:
    """A registry that accepted a 300-byte name under older limits: install refuses it with
    the reason (exit 2), leaving nothing behind, instead of crashing with OSError."""
    archive = tmp_path / "old.tar.gz"
    archive.write_bytes(build([member("n" * 300 + ".txt")], manifest=manifest("legacy"),
                              fmt=tarfile.GNU_FORMAT))
    old = Catalog(server.data, None, Limits(max_name_bytes=4096))
    try:
        assert old.publish_file("alice", archive).created
    finally:
        old.close()
    home = tmp_path / "home"
    home.mkdir()
    out = run_cli("install", "alice/legacy@1.0.0", "--registry", server.url,
                  env={**os.environ, "ENVHUB_HOME": str(home)})
    assert out.returncode == 2, out.stderr
    assert "name of 304 bytes, over the 255-byte limit" in out.stderr
    assert "Traceback" not in out.stderr and "OSError" not in out.stderr
    assert not [p for p in tree(home) if "legacy" in p or p.endswith(".txt")], tree(home)


def test_search_bounds_descriptions_and_the_package_keeps_the_whole(server: Server) -> None:
    text = "a long story " * 70_000  # 910 KB
    data = build([], manifest=manifest("wordy", f'description = "{text}"\n'))
    r = put(server, "/packages/alice/wordy/versions/1.0.0", data, server.tokens["alice"])
    assert r.status_code == 201, r.text
    r = httpx.get(f"{server.url}{API}/search", params={"q": "wordy"})
    (hit,) = r.json()["hits"]
    assert len(hit["description"]) == SEARCH_DESCRIPTION_CHARS
    assert hit["description"].endswith("\u2026") and text.startswith(hit["description"][:-1])
    assert len(r.content) < 2000
    r = httpx.get(f"{server.url}{API}/packages/alice/wordy")
    assert r.json()["description"] == text
