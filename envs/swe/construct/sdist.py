"""Fetching a pinned sdist and cutting the snapshot (package + tests) out of it."""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

from envhub.envs.swe.construct.config import Project


class SdistError(RuntimeError):
    """The pinned sdist could not be fetched or does not match its sha256."""


def fetch_sdist(project: Project, cache: Path) -> Path:
    """The project's sdist in `cache` (downloaded with pip when absent), sha256-checked."""
    cache.mkdir(parents=True, exist_ok=True)
    found = _find(project, cache)
    if found is None:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--no-binary", ":all:", "--dest", str(cache), f"{project.name}=={project.version}"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        found = _find(project, cache)
        if result.returncode != 0 or found is None:
            raise SdistError(f"pip download {project.name}=={project.version} failed (PyPI "
                             f"must be reachable or the sdist placed in {cache}): "
                             f"{result.stderr.strip()[-500:]}")
    digest = hashlib.sha256(found.read_bytes()).hexdigest()
    if digest != project.sha256:
        raise SdistError(f"{found}: sha256 {digest} does not match the pinned {project.sha256}; "
                         "delete the file (a different upload) or update projects.toml")
    return found


def _find(project: Project, cache: Path) -> Path | None:
    names = {project.name.lower(), project.name.lower().replace("-", "_")}
    for path in sorted(cache.glob("*.tar.gz")):
        stem = path.name[: -len(".tar.gz")]
        name, _, version = stem.rpartition("-")
        if name.lower() in names and version == project.version:
            return path
    return None


def snapshot_files(project: Project, sdist: Path) -> dict[str, bytes]:
    """Files selected by `include`, keyed by sdist-relative path (top folder stripped)."""
    files: dict[str, bytes] = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            _, _, rel = member.name.partition("/")
            if "__pycache__" in rel or rel.endswith((".pyc", ".pyo")):
                continue
            if any(rel == inc or (inc.endswith("/") and rel.startswith(inc))
                   for inc in project.include):
                handle = tar.extractfile(member)
                assert handle is not None
                files[rel] = handle.read()
    missing = [p for p in project.mutate + project.tests if p not in files]
    if missing:
        raise SdistError(f"{project.slug}: {', '.join(missing)} not in the snapshot; fix "
                         "`include`/`mutate`/`tests` in projects.toml")
    return dict(sorted(files.items()))


def deterministic_targz(files: dict[str, bytes]) -> bytes:
    """A tar.gz with sorted names, mode 0644, owner 0, mtime 0 and no gzip name or time, so
    the same files always give the same bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[name]))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()
