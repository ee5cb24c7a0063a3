"""Building packages: a deterministic `.tar.gz` of an environment folder plus its digest.

Deterministic means the same folder content always gives the same bytes: entries sorted by
path, mtimes fixed, owners and groups blank, modes normalized to 0644/0755, gzip header
without name or time. VCS, cache and build folders are left out. Packages hold only regular
files and folders: a symlink, device file or FIFO in the folder is refused with the fix.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from envhub.envs.manifest import Manifest, ManifestError, load_manifest
from envhub.registry.errors import BadPackage, TooLarge
from envhub.registry.limits import Limits

MANIFEST = "envhub.toml"
# 1980-01-01: the earliest time a zip can hold; wheels use it too.
FIXED_MTIME = 315532800
EXCLUDED_DIRS = frozenset({
    ".git", ".hg", ".svn", ".bzr", "__pycache__", ".pytest_cache", ".mypy_cache",
    ".ruff_cache", ".venv", "venv", ".tox", ".nox", "node_modules", ".ipynb_checkpoints",
    ".idea", ".vscode", ".eggs", "dist",
})
EXCLUDED_SUFFIXES = (".pyc", ".pyo", ".egg-info", ".swp")
EXCLUDED_FILES = frozenset({".DS_Store", "Thumbs.db"})


@dataclass(frozen=True)
class Packed:
    """A built package on disk."""

    path: Path
    digest: str  # "sha256:<hex>"
    size: int  # compressed bytes
    manifest: Manifest
    files: int
    unpacked_bytes: int


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def archive_name(manifest: Manifest) -> str:
    return f"{manifest.name}-{manifest.version}.tar.gz"


def validate_folder(folder: Path, manifest: Manifest) -> None:
    """Checks that need the folder: the entrypoint module, the tasks file, dependencies."""
    module = manifest.entrypoint.split(":", 1)[0].strip()
    rel = Path(*module.split("."))
    if not module or not ((folder / rel).with_suffix(".py").is_file()
                          or (folder / rel / "__init__.py").is_file()):
        raise BadPackage(f"{folder / MANIFEST}: entrypoint '{manifest.entrypoint}' names module "
                         f"'{module}', but neither {rel}.py nor {rel}/__init__.py exists; "
                         "fix 'entrypoint' or add the file")
    if manifest.tasks.path and not (folder / manifest.tasks.path).is_file():
        raise BadPackage(f"{folder / MANIFEST}: tasks.path '{manifest.tasks.path}' does not "
                         "exist in the package; fix the path or add the file")
    check_dependencies(manifest.dependencies, source=str(folder / MANIFEST))


def check_dependencies(deps: list[str], source: str) -> list[Requirement]:
    out = []
    for dep in deps:
        try:
            req = Requirement(dep)
        except InvalidRequirement as e:
            raise BadPackage(f"{source}: dependency '{dep}' is not a pip requirement ({e}); "
                             "use e.g. 'numpy>=1.26,<3'") from None
        if req.url:  # `name @ https://...`, `git+...`, `file:...`: code from anywhere
            raise BadPackage(f"{source}: dependency '{dep}' is a direct URL or VCS reference, "
                             "which installs whatever that address serves; name a package on "
                             "an index with a version range (e.g. 'numpy>=1.26,<3') or ship "
                             "the code in the package")
        out.append(req)
    return out


def _excluded(name: str, is_dir: bool) -> bool:
    if is_dir:
        return name in EXCLUDED_DIRS or name.endswith(".egg-info")
    return name in EXCLUDED_FILES or name.endswith(EXCLUDED_SUFFIXES)


def collect(folder: Path, limits: Limits) -> list[tuple[str, Path, os.stat_result]]:
    """The package's entries as (archive path, source path, lstat), sorted by archive path."""
    entries: list[tuple[str, Path, os.stat_result]] = []
    total = 0
    for root, dirs, files in os.walk(folder, followlinks=False):
        rootp = Path(root)
        dirs[:] = [d for d in dirs if not _excluded(d, True)]
        for name in [*dirs, *files]:
            path = rootp / name
            st = path.lstat()
            rel = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(st.st_mode):
                raise BadPackage(f"{path} is a symlink; packages hold only regular files and "
                                 "folders: replace it with a copy of its target")
            if stat.S_ISDIR(st.st_mode):
                entries.append((rel, path, st))
                continue
            if _excluded(name, False):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise BadPackage(f"{path} is a device file, FIFO or socket; remove it from the "
                                 "package folder")
            if st.st_size > limits.max_file_bytes:
                raise TooLarge(f"{path} is {st.st_size} bytes, over the {limits.max_file_bytes}"
                               "-byte limit per file; ship large data through `datasets` ids")
            total += st.st_size
            entries.append((rel, path, st))
    if total > limits.max_total_bytes:
        raise TooLarge(f"{folder}: {total} bytes of files, over the {limits.max_total_bytes}"
                       "-byte package limit; leave large data out of the package")
    if len(entries) > limits.max_entries:
        raise TooLarge(f"{folder}: {len(entries)} entries, over the limit of "
                       f"{limits.max_entries}; leave generated files out")
    entries.sort(key=lambda e: e[0])
    return entries


def _tarinfo(rel: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(rel)
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.type = tarfile.REGTYPE
        info.size = st.st_size
        info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    return info


def write_archive(entries: list[tuple[str, Path, os.stat_result]],
                  out: io.BufferedIOBase) -> tuple[int, int]:
    """Write the deterministic tar.gz of `collect()`'s entries to `out`.

    Returns (files, unpacked bytes)."""
    files = total = 0
    # filename="" and mtime=0 keep the gzip header free of the build machine's state.
    with (gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz,
          tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT,
                       encoding="utf-8") as tar):
        for rel, path, st in entries:
            info = _tarinfo(rel, st)
            if info.isdir():
                tar.addfile(info)
                continue
            with open(path, "rb") as f:
                tar.addfile(info, f)
            files += 1
            total += info.size
    return files, total


def pack(folder: str | Path, out_dir: str | Path | None = None,
         limits: Limits | None = None) -> Packed:
    """Validate `folder` and write `<out_dir>/<name>-<version>.tar.gz` (default `folder/dist`).

    The archive is written to a temporary file first, so a failed pack leaves nothing behind.
    """
    limits = limits or Limits()
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise BadPackage(f"{folder} is not a folder; pass an environment folder with an "
                         f"{MANIFEST}")
    try:
        manifest = load_manifest(folder)
    except ManifestError as e:
        raise BadPackage(str(e)) from None
    validate_folder(folder, manifest)
    out = Path(out_dir) if out_dir is not None else folder / "dist"
    out.mkdir(parents=True, exist_ok=True)
    target = out / archive_name(manifest)
    entries = collect(folder, limits)  # before the temp file exists, so it is never included
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".packing-", suffix=".tar.gz")
    try:
        with os.fdopen(fd, "wb") as f:
            files, total = write_archive(entries, f)
        size = os.path.getsize(tmp)
        if size > limits.max_archive_bytes:
            raise TooLarge(f"the package is {size} bytes compressed, over the "
                           f"{limits.max_archive_bytes}-byte limit; leave large data out")
        digest = sha256_file(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Packed(target, digest, size, manifest, files, total)
