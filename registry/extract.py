"""Reading untrusted packages safely: `scan` checks an archive without writing anything,
`unpack_into` extracts it into an empty folder the caller owns (and removes on failure).

Refused, with the reason in the error: entries that are not regular files or folders
(symlinks, hardlinks, devices, FIFOs, sparse files), absolute paths, `..` components,
backslashes, NUL bytes, duplicate paths, archives over the size limits, and streams that
inflate more than `Limits.max_ratio` (decompression bombs). Limits are enforced while
decompressing, so a bomb is stopped after at most `max_stream_bytes` of output, and tar
headers are never trusted for memory (tarfile itself reads through our guarded stream).
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import re
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from envhub.envs.manifest import Manifest, ManifestError, parse_manifest
from envhub.registry.archive import MANIFEST
from envhub.registry.errors import BadPackage, TooLarge
from envhub.registry.limits import Limits

CHUNK = 1 << 16
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class ArchiveInfo:
    manifest: Manifest
    manifest_text: str
    files: int
    unpacked_bytes: int


class _Metered(io.RawIOBase):
    """Counts the compressed bytes consumed, for the inflation ratio."""

    def __init__(self, raw: IO[bytes]):
        self.raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.raw.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.count += n
        return n


class _GuardedGunzip(io.RawIOBase):
    """Decompresses gzip while enforcing the stream-size and ratio limits."""

    def __init__(self, raw: IO[bytes], limits: Limits):
        self.metered = _Metered(raw)
        self.gz = gzip.GzipFile(fileobj=self.metered, mode="rb")
        self.limits = limits
        self.out = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        try:
            data = self.gz.read(min(len(buffer), CHUNK))
        except (OSError, EOFError, zlib.error) as e:
            raise BadPackage(
                f"not a valid .tar.gz ({e}); build packages with `envhub pack`") from e
        n = len(data)
        buffer[:n] = data
        self.out += n
        lim = self.limits
        if self.out > lim.max_stream_bytes:
            raise BadPackage(f"the archive unpacks to more than {lim.max_stream_bytes} bytes "
                             f"(limit {lim.max_total_bytes} bytes of files); refused as too "
                             "large or a decompression bomb")
        if self.out > lim.ratio_floor_bytes and self.out > lim.max_ratio * max(
                self.metered.count, 1):
            raise BadPackage(f"the archive inflates more than {lim.max_ratio:g}x "
                             f"({self.out} bytes from {self.metered.count}); refused as a "
                             "decompression bomb")
        return n


def _kind(m: tarfile.TarInfo) -> str:
    if m.issym():
        return "symlink"
    if m.islnk():
        return "hardlink"
    if m.ischr() or m.isblk():
        return "device file"
    if m.isfifo():
        return "FIFO"
    if m.type == tarfile.GNUTYPE_SPARSE or m.issparse():
        return "sparse file"
    return f"entry of tar type {m.type!r}"


def _link_note(m: tarfile.TarInfo) -> str:
    target = PurePosixPath(m.linkname)
    base = PurePosixPath(m.name).parent if m.issym() else PurePosixPath()
    depth = 0
    for part in (base / target).parts if not target.is_absolute() else ("..",):
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return f" pointing outside the package ('{m.linkname}')"
    return f" ('{m.linkname}')"


def safe_name(m: tarfile.TarInfo, limits: Limits) -> str:
    """The entry's normalized relative path, or BadPackage saying why it is unsafe."""
    name = m.name
    if not name or "\x00" in name or "\\" in name:
        raise BadPackage(f"entry {_short(name)!r}: empty names, NUL bytes and backslashes "
                         "are refused")
    if name.startswith("/") or _DRIVE_RE.match(name):
        raise BadPackage(f"entry '{_short(name)}' is an absolute path; archives must hold "
                         "relative paths (build them with `envhub pack`)")
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > limits.max_path_bytes:
        raise BadPackage(f"entry '{_short(name)}' has a path of {size} bytes, over the "
                         f"{limits.max_path_bytes}-byte limit; use shorter paths")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadPackage(f"entry '{_short(name)}' contains '..' (path traversal); refused")
    for part in parts:
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > limits.max_name_bytes:
            raise BadPackage(f"entry '{_short(name)}' has a file or folder name of {size} "
                             f"bytes, over the {limits.max_name_bytes}-byte limit of "
                             "filesystems; rename it")
    return "/".join(parts)


def _short(name: str) -> str:
    """An entry name fit for a message: long names are cut in the middle."""
    return name if len(name) <= 120 else f"{name[:60]}...{name[-40:]}"


Sink = Callable[[str, tarfile.TarInfo, IO[bytes] | None], None]


@dataclass
class _Seen:
    entries: set[str]  # paths of the archive's entries
    kinds: dict[str, bool]  # path -> is a folder (entries and the folders they imply)


def _admit(m: tarfile.TarInfo, seen: _Seen, limits: Limits) -> str | None:
    """Check one entry; its normalized path, or None for the archive's own root folder."""
    if len(seen.entries) >= limits.max_entries:
        raise BadPackage(f"the archive has more than {limits.max_entries} entries")
    rel = safe_name(m, limits)
    if not (m.isdir() or m.type in (tarfile.REGTYPE, tarfile.AREGTYPE)):
        note = _link_note(m) if (m.issym() or m.islnk()) else ""
        raise BadPackage(f"entry '{m.name}' is a {_kind(m)}{note}; packages hold only "
                         "regular files and folders")
    if rel == "":
        if m.isdir():
            return None
        raise BadPackage(f"entry '{m.name}' has no file name")
    if rel in seen.entries:
        raise BadPackage(f"entry '{rel}' appears twice; refused (the second copy would "
                         "silently replace the first)")
    # A file and a folder of one name cannot both exist: refuse now, not half-way through
    # an install.
    for parent in PurePosixPath(rel).parents:
        if seen.kinds.setdefault(str(parent), True) is False:
            raise BadPackage(f"entry '{rel}' is inside '{parent}', which is a file; refused")
    if seen.kinds.get(rel) is True and not m.isdir():
        raise BadPackage(f"entry '{rel}' is a file but other entries use it as a folder")
    seen.entries.add(rel)
    seen.kinds[rel] = m.isdir()
    if not m.isdir() and m.size > limits.max_file_bytes:
        raise BadPackage(f"entry '{rel}' is {m.size} bytes, over the {limits.max_file_bytes}"
                         "-byte limit per file")
    return rel


def _manifest_bytes(m: tarfile.TarInfo, data: IO[bytes], limits: Limits) -> bytes:
    if m.size > limits.max_manifest_bytes:
        raise BadPackage(f"{MANIFEST} is over {limits.max_manifest_bytes} bytes")
    raw = data.read()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadPackage(f"{MANIFEST} is not UTF-8 text") from None
    return raw


def _walk(archive: Path, limits: Limits, sink: Sink) -> ArchiveInfo:
    size = archive.stat().st_size
    if size > limits.max_archive_bytes:
        raise TooLarge(f"the archive is {size} bytes, over the {limits.max_archive_bytes}-byte "
                       "limit")
    seen = _Seen(set(), {})
    files = total = 0
    manifest: bytes | None = None
    with open(archive, "rb") as raw:
        stream = io.BufferedReader(_GuardedGunzip(raw, limits), CHUNK)
        try:
            tar = tarfile.open(fileobj=stream, mode="r|", encoding="utf-8")  # noqa: SIM115
            # (closing `tar` would only close `stream`, which the outer `with` owns)
            for m in tar:
                rel = _admit(m, seen, limits)
                if rel is None:
                    continue
                if m.isdir():
                    sink(rel, m, None)
                    continue
                files, total = files + 1, total + m.size
                if total > limits.max_total_bytes:
                    raise BadPackage(f"the archive holds more than {limits.max_total_bytes} "
                                     "bytes of files")
                data = tar.extractfile(m)
                assert data is not None, "regular files always have data"
                if rel == MANIFEST:
                    manifest = _manifest_bytes(m, data, limits)
                    data = io.BytesIO(manifest)
                sink(rel, m, data)
        except tarfile.TarError as e:
            raise BadPackage(
                f"not a valid .tar.gz ({e}); build packages with `envhub pack`") from e
    if manifest is None:
        raise BadPackage(f"the archive has no {MANIFEST} at its root; build packages with "
                         "`envhub pack` from the environment folder")
    text = manifest.decode("utf-8")
    try:
        parsed = parse_manifest(text, f"{MANIFEST} in the archive")
    except ManifestError as e:
        raise BadPackage(str(e)) from None
    return ArchiveInfo(parsed, text, files, total)


def _drain(rel: str, m: tarfile.TarInfo, data: IO[bytes] | None) -> None:
    # Reading the data is what runs the ratio/size guards on it.
    if data is not None:
        while data.read(CHUNK):
            pass


def scan(archive: str | Path, limits: Limits | None = None) -> ArchiveInfo:
    """Check `archive` completely without writing anything; returns its manifest."""
    return _walk(Path(archive), limits or Limits(), _drain)


def unpack_into(archive: str | Path, folder: str | Path,
                limits: Limits | None = None) -> ArchiveInfo:
    """Extract `archive` into the existing, empty `folder`.

    On error `folder` may hold partial content: callers extract into a staging folder and
    delete it on failure (see install.py), so nothing half-written is ever visible.
    """
    root = Path(folder)
    if any(root.iterdir()):
        raise BadPackage(f"{root} is not empty; extract into a fresh folder")

    def write(rel: str, m: tarfile.TarInfo, data: IO[bytes] | None) -> None:
        target = root / rel
        try:
            if data is None:
                target.mkdir(parents=True, exist_ok=True)
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            mode = 0o755 if m.mode & 0o111 else 0o644
            # O_EXCL|O_NOFOLLOW: never write through anything that already exists.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        except (FileExistsError, NotADirectoryError, IsADirectoryError) as e:
            raise BadPackage(f"entry '{rel}' conflicts with another entry ({e.strerror})") from None
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:
                raise
            raise BadPackage(f"entry '{_short(rel)}' has a name this filesystem refuses "
                             f"({e.strerror}); the package cannot be installed here") from None
        with os.fdopen(fd, "wb") as out:
            while chunk := data.read(CHUNK):
                out.write(chunk)

    return _walk(Path(archive), limits or Limits(), write)
