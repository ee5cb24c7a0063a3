"""Carrying a rollout's declared output paths from the agent's container into a fresh grader
container started from the pristine task image (docker only).

The agent's files are read by the Docker engine (`get_archive`: no program of the agent's
container runs, so a trojaned `tar` or shell does not matter), rewritten while they stream
(byte and entry caps checked before anything reaches the host's disk) into a clean archive in
a host temp file, which is all the grader gets:

- only regular files, directories, symlinks (kept as links, never followed) and hard links to
  files already carried; devices and fifos are dropped; setuid/setgid/sticky bits are cleared;
- nothing outside the declared path, nothing below a symlink (a crafted `link/x` cannot write
  through `link` into the grader's toolchain);
- interpreter start-up hooks are dropped: `*.pth`, `sitecustomize.py`, `usercustomize.py` and
  compiled bytecode (`*.pyc`, `__pycache__/`): a forged .pyc with the source's mtime would run
  instead of the source the tests read. Python rebuilds bytecode from the carried sources.

In the grader the declared path is removed first (what the agent deleted stays deleted), then
the clean archive is extracted there. A path the agent removed is simply absent.
"""

from __future__ import annotations

import io
import posixpath
import shlex
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from envhub.envs.errors import AgentOutputError
from envhub.envs.sandbox.archive import tar_path
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.engine import docker_client, import_docker, in_thread
from envhub.envs.sandbox.errors import SandboxClosed, SandboxError

MAX_ENTRIES = 100_000  # files + folders + links per rollout: a million empty files is no output
TAR_SLACK = 4 << 20  # headers and padding on top of the file bytes
HOOK_NAMES = {"sitecustomize.py", "usercustomize.py"}
HOOK_SUFFIXES = (".pth", ".pyc", ".pyo")
SHOWN_DROPPED = 40  # how many dropped names the verdict lists
# Variables naming where programs, modules and libraries are looked up, or files a shell or the
# dynamic loader runs first: a carried artifact inside one of these would be the grader's code.
SEARCH_VARS = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP",
               "LD_LIBRARY_PATH", "LD_PRELOAD", "BASH_ENV", "ENV", "NODE_PATH", "PERL5LIB",
               "RUBYLIB", "GEM_HOME", "GEM_PATH", "CLASSPATH")


class ArtifactsTooLarge(AgentOutputError):
    """The agent's output paths hold more bytes or entries than the task allows."""


@dataclass
class Carried:
    """What travelled into the grader: per path, entries and file bytes; what was dropped."""

    entries: int = 0
    file_bytes: int = 0
    missing: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entries": self.entries, "file_bytes": self.file_bytes}
        if self.missing:
            out["missing"] = self.missing
        if self.dropped:
            out["dropped"] = self.dropped[:SHOWN_DROPPED]
            out["dropped_count"] = len(self.dropped)
        return out


def image_search_dirs(grader: Sandbox, extra_env: dict[str, str]) -> dict[str, list[str]]:
    """SEARCH_VARS of the grader container (its image's ENV) and of the verifier's env, split
    into absolute entries: variable -> paths."""
    env = dict(e.partition("=")[::2] for e in
               docker_client().api.inspect_container(grader.id)["Config"].get("Env") or [])
    env.update(extra_env)
    return {var: [posixpath.normpath(p) for p in env[var].split(":") if p.startswith("/")]
            for var in SEARCH_VARS if env.get(var)}


def _is_hook(parts: list[str]) -> bool:
    return ("__pycache__" in parts or parts[-1] in HOOK_NAMES
            or parts[-1].endswith(HOOK_SUFFIXES))


class _Capped(io.RawIOBase):
    """The engine's archive stream (an iterator of chunks) read as a file; ArtifactsTooLarge
    as soon as more than `limit` bytes came, before they reach the host's disk."""

    def __init__(self, chunks: Any, limit: int, path: str) -> None:
        self.chunks, self.limit, self.path = iter(chunks), limit, path
        self.pending, self.total = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.total += len(chunk)
            if self.total > self.limit:
                raise ArtifactsTooLarge(
                    f"{self.path} in the agent's container holds more than "
                    f"{(self.limit - TAR_SLACK) >> 20} MiB (the task's artifacts_max_mb): "
                    "too large to grade")
            self.pending = chunk
        n = min(len(buffer), len(self.pending))
        buffer[:n], self.pending = self.pending[:n], self.pending[n:]
        return n


def _open_archive(container_id: str, path: str) -> Any | None:
    """The engine's tar stream of `path` in the container; None when there is no such path."""
    docker = import_docker()
    api = docker_client().api
    try:
        stream, _ = api.get_archive(container_id, path)
    except docker.errors.NotFound:
        try:
            api.inspect_container(container_id)
        except docker.errors.NotFound:
            raise SandboxClosed(f"the agent's container {container_id[:12]} is gone") from None
        return None
    except docker.errors.APIError as e:
        raise SandboxError(f"cannot read {path} from the agent's container: "
                           f"{e.explanation or e}") from None
    return stream


def _collect_blocking(container_id: str, path: str, limit: int, carried: Carried,
                      into: IO[bytes]) -> bool:
    stream = _open_archive(container_id, path)
    if stream is None:
        return False
    try:
        raw = io.BufferedReader(_Capped(stream, limit + TAR_SLACK, path), 1 << 20)
        _filter_blocking(raw, into, posixpath.basename(path), limit, carried)
    except tarfile.TarError as e:
        raise SandboxError(f"the engine's archive of {path} is not a tar: {e}") from None
    finally:
        stream.close()
    return True


def _filter_blocking(raw: IO[bytes], out: IO[bytes], root: str, limit: int,
                     carried: Carried) -> None:
    """Rewrite the engine's tar (root entry named `root`) into `out`, keeping what the module
    docstring says travels."""
    links: set[str] = set()  # symlinks carried: nothing below them travels
    kept: set[str] = set()
    with tarfile.open(fileobj=raw, mode="r|") as src, \
            tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as dst:
        for member in src:
            carried.entries += 1
            if carried.entries > MAX_ENTRIES:
                raise ArtifactsTooLarge(f"the agent's output paths hold more than {MAX_ENTRIES} "
                                        "files and folders: too many to grade")
            name = member.name.rstrip("/")
            parts = name.split("/")
            why = _refusal(member, parts, root, links, kept)
            if why:
                shown = name[:200].encode("utf-8", "backslashreplace").decode()  # JSON-safe
                carried.dropped.append(f"{shown} ({why})")
                continue
            member.mode &= 0o777
            if member.issym():
                links.add(name)
            if member.isreg():
                carried.file_bytes += member.size
                if carried.file_bytes > limit:
                    raise ArtifactsTooLarge(f"the agent's output paths hold more than "
                                            f"{limit >> 20} MiB: too large to grade")
                dst.addfile(member, src.extractfile(member))
            else:
                dst.addfile(member)
            kept.add(name)
    out.flush()
    out.seek(0)


def _refusal(member: tarfile.TarInfo, parts: list[str], root: str, links: set[str],
             kept: set[str]) -> str:
    """Why `member` does not travel ('' when it does)."""
    if member.name.startswith("/") or parts[0] != root or ".." in parts:
        return "outside the declared path"
    if any("/".join(parts[:i]) in links for i in range(1, len(parts))):
        return "below a symlink"
    if _is_hook(parts):
        return "interpreter start-up hook or bytecode"
    if member.islnk():
        return "" if member.linkname.rstrip("/") in kept else "hard link to a file not carried"
    if not (member.isreg() or member.isdir() or member.issym()):
        return "not a file, folder or symlink"
    return ""


def _put_blocking(container_id: str, directory: str, data: IO[bytes]) -> None:
    docker = import_docker()
    try:
        docker_client().api.put_archive(container_id, directory, data)
    except docker.errors.APIError as e:
        raise SandboxError(f"cannot place files in the grader under {directory}: "
                           f"{e.explanation or e}") from None


async def collect(path: str, agent: Sandbox, limit: int, carried: Carried,
                  into: IO[bytes]) -> bool:
    """Write the clean archive of the agent's `path` to `into` (a binary temp file), filtered
    while the engine streams it; False when the agent's container has no such path.
    ArtifactsTooLarge (the agent's doing); SandboxError when the container fails."""
    if not await in_thread(_collect_blocking, agent.id, path, limit, carried, into):
        carried.missing.append(path)
        return False
    return True


def wipe_command(paths: list[str]) -> str:
    """Shell removing `paths` and making their parents (run in the grader before `place`)."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    parents = " ".join(shlex.quote(posixpath.dirname(p)) for p in paths)
    return f"rm -rf -- {quoted} && mkdir -p -- {parents}" if paths else "true"


async def place(grader: Sandbox, path: str, archive: IO[bytes]) -> None:
    """Extract a `collect`ed archive at `path` in the grader (after `wipe_command`)."""
    await in_thread(_put_blocking, grader.id, posixpath.dirname(path), archive)


async def put_tree(grader: Sandbox, local: Path, remote: str) -> None:
    """Copy a local tree (the task's tests/) to `remote` in the grader in one engine call."""
    data = await in_thread(tar_path, local, posixpath.basename(remote))
    await in_thread(_put_blocking, grader.id, posixpath.dirname(remote), io.BytesIO(data))
