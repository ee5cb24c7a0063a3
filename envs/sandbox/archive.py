"""Tar helpers for moving files and trees in and out of sandboxes."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from envhub.envs.sandbox.errors import SandboxFileError


def tar_path(source: Path, arcname: str) -> bytes:
    """An uncompressed tar of a local file or tree, its root named `arcname`."""
    if not source.exists():
        raise SandboxFileError(f"{source}: no such local file or directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(source, arcname=arcname)
    return buffer.getvalue()


def extract_as(raw: bytes, local: Path) -> None:
    """Extract a tar with one top-level entry so that this entry lands at `local`.

    The "data" filter refuses absolute names, `..`, device files and links leaving the tree:
    a hostile sandbox cannot write outside `local` through a crafted archive.
    """
    local.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = tar.getmembers()
        if not members:
            raise SandboxFileError("empty archive from the sandbox")
        root = members[0].name.split("/")[0]
        for member in members:
            if member.name.split("/")[0] != root:
                raise SandboxFileError(f"archive from the sandbox has several roots ({root}, "
                                       f"{member.name})")
            member.name = local.name + member.name[len(root):]
        tar.extractall(local.parent, members=members, filter="data")
