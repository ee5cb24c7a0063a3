"""What of the host a local (bubblewrap) sandbox sees: an allow-list, nothing else.

The sandbox's root is an empty tmpfs, read-only once the mounts are made. Onto it go, read-only:
the system folders (/usr and the /bin, /sbin, /lib* entries, symlinks into /usr on merged-/usr
systems), the few files of /etc that programs read without a network (users and groups, the
dynamic linker's cache, alternatives, locale and time zone, Python's system config), the host
paths an environment declares (`[sandbox] host_paths`, e.g. a toolchain under /opt), and the
sandbox's own folders (workdir, /tmp, /dev, /proc). /root, /home, /work, /tmp, /var, /opt, /srv,
/mnt, /media, /run and everything else of the host are absent, so a second copy of envhub's
sources or task data anywhere there is out of reach without our having to find it.

Inside the allowed folders, copies of envhub itself (a system-wide or declared install, whose
built-in environments hold gold patches and hidden tests) are covered with an empty tmpfs.
"""

from __future__ import annotations

import glob
import importlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

#: top-level host entries bound read-only when present (dirs) or recreated (symlinks)
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: entries of /etc a program may read with no network: identity lookups, the linker's cache,
#: alternatives (/usr/bin/python -> ...), locale, time zone, MIME and magic databases, shells'
#: and Python's system config, CA certificates (no private keys: only ssl/certs)
ETC = ("alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf",
       "debian_version", "group", "host.conf", "hostname", "hosts", "inputrc", "issue",
       "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "locale.alias", "localtime", "magic",
       "magic.mime", "mime.types", "mtab", "networks", "nsswitch.conf", "os-release", "passwd",
       "perl", "profile", "protocols", "python3*", "rpc", "services", "shells", "ssl/certs",
       "ssl/openssl.cnf", "terminfo", "timezone")
#: added when the spec grants network access: name resolution
ETC_NETWORK = ("resolv.conf", "gai.conf")
#: where an install of envhub may sit inside an allowed folder: the system's site folders, and
#: relative to a declared host path (a virtualenv or prefix under /opt, say) its own
SITE_DIRS = ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages")
SITE_DIRS_UNDER = ("lib/python3*/*-packages", "local/lib/python3*/*-packages", "*-packages", "")
_COMPONENTS = ("envhub", "envhub.sdk", "envhub.gateway", "envhub.envs", "envhub.registry",
               "envhub.trainer")


def _bind(path: Path) -> list[str]:
    """Arguments making `path` (a host entry) appear at the same place, read-only."""
    if path.is_symlink():
        return ["--symlink", os.readlink(path), str(path)]
    if path.exists():
        return ["--ro-bind", str(path), str(path)]
    return []


def allowed_paths(network: bool, host_paths: Sequence[str] = ()) -> list[Path]:
    """The host entries a sandbox sees (existing ones only, /etc patterns expanded)."""
    paths = [Path("/") / name for name in SYSTEM]
    for pattern in ETC + (ETC_NETWORK if network else ()):
        paths += sorted(Path(p) for p in glob.glob(f"/etc/{pattern}"))
    paths += [Path(p) for p in host_paths]
    return [p for p in paths if p.is_symlink() or p.exists()]


def _envhub_copies(host_paths: Sequence[str]) -> set[Path]:
    """envhub as imported (its package folders, and for an editable install the checkout) plus
    any `envhub` package in the system's site folders or a declared host path's."""
    found: set[Path] = set()
    for name in _COMPONENTS:
        folder = Path(importlib.import_module(name).__file__ or "").resolve().parent
        found.add(folder)
        if (folder.parent / "pyproject.toml").is_file():
            found.add(folder.parent)
    sites = list(SITE_DIRS) + [f"{glob.escape(root)}/{rel}" for root in host_paths
                               for rel in SITE_DIRS_UNDER]
    for site in sites:
        found.update(Path(p).resolve() for p in glob.glob(f"{site}/envhub"))
    return found


def private_paths(visible: Iterable[Path], host_paths: Sequence[str] = ()) -> list[str]:
    """Copies of envhub (and ENVHUB_HOME) lying inside a visible folder, outermost only: they
    are covered with an empty read-only tmpfs (bwrap needs the mount point to exist, and one
    inside a hidden folder is hidden already)."""
    roots = [p.resolve() for p in visible if not p.is_symlink()]
    home = Path(os.environ.get("ENVHUB_HOME", Path.home() / ".envhub")).resolve()
    kept = sorted(p for p in _envhub_copies(host_paths) | {home}
                  if p.is_dir() and any(p == r or r in p.parents for r in roots))
    return [str(p) for p in kept if not any(q != p and q in p.parents for q in kept)]


RUN_BYTES = 16 << 20  # /run: only mount points of binds (an agent's channel) live there


def host_view_args(network: bool, host_paths: Sequence[str] = (), *,
                   scratch: str | None = None, scratch_bytes: int = 1 << 30) -> list[str]:
    """bwrap arguments building the sandbox's root: an empty tmpfs, the allowed host entries
    read-only, envhub's copies covered, a private /tmp, /dev/shm and /run. The caller binds the
    workdir and ends its mounts with `--remount-ro /` (the root stays writable until every
    mount point is made). `scratch`: a host folder whose `tmp/` and `shm/` become /tmp and
    /dev/shm (on the sandbox's bounded disk, disk.py); without it each is a tmpfs of
    `scratch_bytes`. /dev itself is read-only (its device nodes still work)."""
    visible = allowed_paths(network, host_paths)
    # the sandbox's own folders first: a declared path under /tmp goes on top of the tmpfs
    args = ["--tmpfs", "/", "--dev", "/dev"]
    if scratch is not None:
        args += ["--bind", f"{scratch}/shm", "/dev/shm"]
    else:
        args += ["--size", str(scratch_bytes), "--tmpfs", "/dev/shm"]
    args += ["--remount-ro", "/dev", "--proc", "/proc"]
    if scratch is not None:
        args += ["--bind", f"{scratch}/tmp", "/tmp"]
    else:
        args += ["--size", str(scratch_bytes), "--tmpfs", "/tmp"]
    args += ["--size", str(RUN_BYTES), "--tmpfs", "/run"]
    # parents made explicitly get mode 0755 (those bwrap makes on its own are 0700)
    for parent in sorted({str(q) for p in visible for q in p.parents if q != Path("/")}):
        args += ["--dir", parent]
    for path in visible:
        args += _bind(path)
    for hidden in private_paths(visible, host_paths):
        args += ["--tmpfs", hidden, "--remount-ro", hidden]
    return args
