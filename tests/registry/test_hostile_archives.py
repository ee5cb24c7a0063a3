"""Hostile archives are refused by the reader and by install, leaving nothing on disk."""

from __future__ import annotations

import asyncio
import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from envhub.registry.archive import sha256_file
from envhub.registry.catalog import versions
from envhub.registry.errors import BadPackage, DigestMismatch, TooLarge
from envhub.registry.extract import scan, unpack_into
from envhub.registry.install import install
from envhub.registry.limits import Limits
from envhub.registry.sources import LocalRegistry
from tests.registry.conftest import make_env, tree
from tests.registry.hostile import HOSTILE, build, member

EXPECTED = {
    "dotdot traversal": "path traversal",
    "nested dotdot traversal": "path traversal",
    "absolute path": "absolute path",
    "symlink outside": "symlink pointing outside",
    "absolute symlink": "symlink pointing outside",
    "hardlink outside": "hardlink pointing outside",
    "char device": "device file",
    "block device": "device file",
    "fifo": "FIFO",
    "duplicate entry": "appears twice",
    "backslash path": "backslashes",
    "file used as a folder": "which is a file",
    "folder after its file": "as a folder",
    "zip bomb (ratio)": "decompression bomb",
    "pax header bomb": "decompression bomb",
    "no manifest": "no envhub.toml",
    "malformed manifest": "not valid TOML",
    "invalid manifest field": "field 'name'",
    "not gzip": "not a valid .tar.gz",
    "truncated gzip": "not a valid .tar.gz",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_reader_refuses(case: str, tmp_path: Path) -> None:
    archive = tmp_path / "hostile.tar.gz"
    archive.write_bytes(HOSTILE[case]())
    with pytest.raises(BadPackage, match=EXPECTED[case]):
        scan(archive)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(BadPackage, match=EXPECTED[case]):
        unpack_into(archive, out)
    assert not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/envhub-escaped.txt").exists()
    assert not any(p.is_symlink() for p in out.rglob("*"))


def test_total_size_and_entry_limits(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(build([member("big.bin", data=os.urandom(300_000))]))
    with pytest.raises(BadPackage, match="per file"):
        scan(archive, Limits(max_file_bytes=200_000))
    with pytest.raises(BadPackage, match="more than 200000 bytes of files"):
        scan(archive, Limits(max_total_bytes=200_000))
    with pytest.raises(TooLarge, match="over the"):
        scan(archive, Limits(max_archive_bytes=1000))
    many = tmp_path / "many.tar.gz"
    many.write_bytes(build([member(f"f{i}.txt") for i in range(50)]))
    with pytest.raises(BadPackage, match="more than 20 entries"):
        scan(many, Limits(max_entries=20))
    assert scan(many).files == 52


def test_stream_guard_bounds_a_pax_header_bomb(tmp_path: Path) -> None:
    # With the ratio check off, the total-size guard alone stops a 64 MiB header early.
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(HOSTILE["pax header bomb"]())
    limits = Limits(max_total_bytes=1 << 20, max_entries=10, max_ratio=1e9)
    with pytest.raises(BadPackage, match="unpacks to more than"):
        scan(archive, limits)


def _plant(home: Path, data: bytes, owner: str = "alice", name: str = "my-env",
           version: str = "1.2.0") -> LocalRegistry:
    """A malicious registry: an index row whose digest matches hostile bytes (as if the
    registry itself were compromised, its signing key with it), written straight into the
    local registry and signed: what install's own checks of the archive must still stop."""
    reg = LocalRegistry(home)
    incoming = reg.catalog.blobs.incoming()
    incoming.write_bytes(data)
    digest = sha256_file(incoming)
    reg.catalog.blobs.place(incoming, digest)
    with reg.catalog.engine.begin() as conn:
        conn.execute(versions.insert().values(
            owner=owner, name=name, version=version, digest=digest, size=len(data),
            yanked=False, description="", dependencies=json.dumps([]), manifest="",
            published_at=time.time(), publisher="mallory"))
        reg.catalog.sign_version(conn, owner, name, version, digest)
    return reg


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_install_refuses_hostile_blob_and_leaves_nothing(case: str, home: Path) -> None:
    reg = _plant(home, HOSTILE[case]())
    before = tree(home)
    with pytest.raises(BadPackage, match=EXPECTED[case]):
        asyncio.run(install("alice/my-env@1.2.0", reg, home))
    assert tree(home) == before
    asyncio.run(reg.aclose())


def test_install_refuses_a_package_whose_manifest_names_another(home: Path,
                                                                 tmp_path: Path) -> None:
    from envhub.registry.archive import pack

    packed = pack(make_env(tmp_path / "env", name="other-env"), tmp_path / "dist")
    reg = _plant(home, packed.path.read_bytes())
    before = tree(home)
    with pytest.raises(BadPackage, match="says other-env@1.2.0"):
        asyncio.run(install("alice/my-env@1.2.0", reg, home))
    assert tree(home) == before
    asyncio.run(reg.aclose())


def test_install_refuses_a_tampered_blob(home: Path, tmp_path: Path) -> None:
    from envhub.registry.archive import pack
    from envhub.registry.models import not_audited

    packed = pack(make_env(tmp_path / "env"), tmp_path / "dist")
    reg = LocalRegistry(home)
    asyncio.run(reg.publish("alice", packed.path, packed.digest, "my-env", "1.2.0",
                          not_audited("test")))
    blob = reg.catalog.blobs.path(packed.digest)
    # Same size, one byte flipped: only the digest can tell.
    data = bytearray(blob.read_bytes())
    data[-5] ^= 0xFF
    blob.write_bytes(bytes(data))
    before = tree(home)
    with pytest.raises(DigestMismatch, match="digest"):
        asyncio.run(install("alice/my-env@1.2.0", reg, home))
    assert tree(home) == before
    asyncio.run(reg.aclose())


def test_unpacked_files_cannot_be_setuid(tmp_path: Path) -> None:
    info, data = member("tool", data=b"#!/bin/sh\n")
    info.mode = 0o4777
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(build([(info, data)]))
    out = tmp_path / "out"
    out.mkdir()
    unpack_into(archive, out)
    assert (out / "tool").stat().st_mode & 0o7777 == 0o755
    with tarfile.open(archive) as tar:
        assert tar.getmember("tool").mode == 0o4777
