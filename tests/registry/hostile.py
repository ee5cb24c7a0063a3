"""Builders for hostile .tar.gz archives (written by hand with tarfile, the way an
attacker would, bypassing `envhub pack`)."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable

MANIFEST = b'name = "my-env"\nversion = "1.2.0"\nentrypoint = "env:TinyEnv"\n'


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def build(entries: list[tuple[tarfile.TarInfo, bytes | None]], manifest: bytes | None = MANIFEST,
          fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A gzip'd tar: the manifest and env.py first (unless manifest is None), then entries."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tar:
        if manifest is not None:
            for info, data in (_file("envhub.toml", manifest),
                               _file("env.py", b"class TinyEnv: pass\n")):
                tar.addfile(info, io.BytesIO(data))
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(raw.getvalue())


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x",
           linkname: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    if kind in (tarfile.REGTYPE, tarfile.AREGTYPE):
        info.size = len(data)
        return info, data
    return info, None


def pax_header_bomb(claimed: int = 64 << 20) -> bytes:
    """A pax extended header claiming `claimed` bytes of zeros: tarfile would read it all
    into memory before looking at any file; gzip shrinks it ~1000x."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    header.size = claimed
    block = header.tobuf(format=tarfile.USTAR_FORMAT)

    def body() -> bytes:
        return b"\0" * claimed

    return gzip.compress(block + body(), compresslevel=6)


HOSTILE: dict[str, Callable[[], bytes]] = {
    "dotdot traversal": lambda: build([member("../escaped.txt")]),
    "nested dotdot traversal": lambda: build([member("data/../../escaped.txt")]),
    "absolute path": lambda: build([member("/tmp/envhub-escaped.txt")]),
    "symlink outside": lambda: build([member("link", tarfile.SYMTYPE, linkname="../../etc")]),
    "absolute symlink": lambda: build([member("link", tarfile.SYMTYPE, linkname="/etc/passwd")]),
    "hardlink outside": lambda: build([member("hl", tarfile.LNKTYPE,
                                              linkname="../../etc/passwd")]),
    "char device": lambda: build([member("dev", tarfile.CHRTYPE)]),
    "block device": lambda: build([member("blk", tarfile.BLKTYPE)]),
    "fifo": lambda: build([member("pipe", tarfile.FIFOTYPE)]),
    "duplicate entry": lambda: build([member("env.py", data=b"import os; os.system('x')\n")]),
    "file used as a folder": lambda: build([member("data"), member("data/x.txt")]),
    "folder after its file": lambda: build([member("data/x.txt"), member("data")]),
    "backslash path": lambda: build([member("..\\..\\evil.txt")]),
    "zip bomb (ratio)": lambda: build([member("zeros.bin", data=b"\0" * (24 << 20))]),
    "pax header bomb": pax_header_bomb,
    "no manifest": lambda: build([member("env.py")], manifest=None),
    "malformed manifest": lambda: build([], manifest=b"name = [broken\n"),
    "invalid manifest field": lambda: build([], manifest=b'name = "My Env!"\nversion = "1"\n'
                                                       b'entrypoint = "env:X"\n'),
    "not gzip": lambda: b"PK\x03\x04 this is a zip file, not a tar.gz" * 10,
    "truncated gzip": lambda: build([member("a.txt", data=b"hello" * 1000)])[:60],
}
