"""A private copy of a taskset's source, taken when its tasks are loaded: tasks are listed,
episodes run and rewards computed from it, never from the user's folder again, so nothing
that writes there during a run (a tool, a stray process) changes what grades the episodes. Its
digest is checked before each score.

An installed taskset id is not copied: it lives in verifiers' interpreter's site-packages. A
module file's sibling modules are not copied either: they are imported from its folder
(`path`), as before; a package folder is copied whole.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

MAX_SNAPSHOT_BYTES = 256 << 20
IGNORED = ("__pycache__", "*.pyc", ".git", ".venv*")


@dataclass
class Snapshot:
    ref: str  # the taskset reference the worker loads: the copy's path, or the installed id
    path: list[str]  # folders the worker imports the copy's siblings from (module files)
    digest: str | None  # sha256 of the copy; None for an installed taskset


def take(ref: str, owner: object) -> Snapshot:
    """Copy the module file or package folder `ref` into a private folder, removed with
    `owner`; an installed id (no such path) is returned as it is. Raises ValueError (with the
    fix) for a package folder too large to copy."""
    src = Path(ref)
    if not src.exists():
        return Snapshot(ref, [], None)
    if src.is_dir():
        size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
        if size > MAX_SNAPSHOT_BYTES:
            raise ValueError(f"{src}: the taskset package holds {size >> 20} MiB, over the "
                             f"{MAX_SNAPSHOT_BYTES >> 20} MiB envhub copies for a run; keep data "
                             "files outside the package folder")
    folder = Path(tempfile.mkdtemp(prefix="envhub-vf-taskset-"))
    weakref.finalize(owner, shutil.rmtree, folder, True)
    dest = folder / src.name
    if src.is_dir():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*IGNORED), symlinks=False)
    else:
        shutil.copy2(src, dest)
    for f in (dest, *dest.rglob("*")):
        if f.is_file():  # read-only files (the folders stay writable, for the clean-up)
            f.chmod(f.stat().st_mode & ~0o222)
    siblings = [] if src.is_dir() else [str(src.parent)]
    return Snapshot(str(dest), siblings, digest(dest))


def digest(path: Path) -> str:
    """sha256 over the relative names and contents of `path` (a file or a folder)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
    for f in files:
        h.update(str(f.relative_to(path.parent)).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def intact(snap: Snapshot) -> bool:
    """Whether the copy is still what was taken (an installed taskset: always)."""
    return snap.digest is None or digest(Path(snap.ref)) == snap.digest
