"""E2B sandbox: a Firecracker microVM in E2B's cloud, driven by the official `e2b` SDK.

Running for real:
    pip install 'envhub[e2b]'
    export E2B_API_KEY=e2b_...           # https://e2b.dev/dashboard -> API keys
    envhub run ... --sandbox e2b         # or open_sandbox("e2b", spec)
The spec's `image` names the E2B template (default "base"; build your own with the E2B CLI:
`e2b template build`, it must have bash and coreutils), `network` maps to
`allow_internet_access`. Sandboxes live at most ENVHUB_E2B_LIFETIME_S seconds (default 3600;
E2B Hobby caps it at 1 h) and carry the envhub labels as metadata, so `reap()` finds them.
Mind E2B's creation rate limits (Hobby: 1 create/s, 20 concurrent).

Offline (tests, CI): point the SDK at the fake in `envhub.envs.sandbox.e2b_fake` with
E2B_API_URL / E2B_SANDBOX_URL / E2B_HTTP_VERSION=1.1 (see its docstring); nothing here
changes.

Commands run under the same in-sandbox wrapper as docker (shell.py): output via files, a
`timeout` process group, and a sweep of escaped processes after a timeout. The output is read
as it streams and capped on the host (STREAM_CAP, as docker's): a command can write around the
wrapper's own cap (its `/proc/<pid>/fd/N` is the stream itself); past the cap it is killed and
told why, and no call waits past its timeout plus BACKSTOP_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
import shlex
import time
import uuid
from pathlib import Path
from typing import Any

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox.archive import extract_as, tar_path
from envhub.envs.sandbox.base import MAX_READ_BYTES, ExecResult
from envhub.envs.sandbox.errors import (
    FileTooLarge,
    SandboxClosed,
    SandboxError,
    SandboxFileError,
    SandboxUnavailable,
)
from envhub.envs.sandbox.reaper import (
    LABEL_OWNER,
    LABEL_RUN,
    LABEL_SANDBOX,
    install,
    owner_alive,
    sandbox_labels,
    track,
    untrack,
)
from envhub.envs.sandbox.shell import (
    EXEC_ID_VAR,
    MAX_STREAM_BYTES,
    SWEEP,
    SWEEP_TAGGED,
    timed_out,
    wrapper_line,
)

WORKDIR = "/home/user"
DEFAULT_TEMPLATE = "base"
BACKSTOP_S = 30.0
MAX_DOWNLOAD_BYTES = 1 << 30  # a folder download (packed as one tar) brings at most this
STREAM_CAP = 2 * MAX_STREAM_BYTES + (64 << 10)  # what the wrapper lets through, both streams
OVER_CAP = "envhub: output past the cap was dropped and the command killed"


def import_e2b() -> Any:
    try:
        import e2b
    except ImportError:
        raise SandboxUnavailable("the e2b sandbox needs the E2B SDK: pip install 'envhub[e2b]'"
                                 ) from None
    return e2b


def _api_key() -> str:
    key = os.environ.get("E2B_API_KEY")
    if not key:
        raise SandboxUnavailable("the e2b sandbox needs an API key: export E2B_API_KEY=e2b_... "
                                 "(or use sandbox kind 'docker' / 'local')")
    return key


def _kill_blocking(sandbox_id: str) -> None:
    import_e2b().Sandbox.kill(sandbox_id, api_key=_api_key())


class E2BSandbox:
    """One E2B sandbox. Create with `await E2BSandbox.create(...)`; always `close()`."""

    kind = "e2b"

    def __init__(self, sdk_sandbox: Any, spec: SandboxSpec) -> None:
        self.sdk = sdk_sandbox
        self.id: str = sdk_sandbox.sandbox_id
        self.spec = spec
        self.workdir = WORKDIR
        self._closed = False

    @classmethod
    async def open(cls, spec: SandboxSpec, *, run_id: str, labels: dict[str, str],
                   env: dict[str, str], package_root: str | Path) -> E2BSandbox:
        """The kinds table's entry point: the spec's `image` names the E2B template."""
        return await cls.create(spec, run_id, labels, env)

    @staticmethod
    def reap(run_id: str | None = None, stale_only: bool = False) -> list[str]:
        return reap_e2b(run_id, stale_only)

    @classmethod
    async def create(cls, spec: SandboxSpec, run_id: str, labels: dict[str, str] | None = None,
                     env: dict[str, str] | None = None) -> E2BSandbox:
        install()
        e2b = import_e2b()
        key = _api_key()
        lifetime = int(os.environ.get("ENVHUB_E2B_LIFETIME_S", "3600"))
        try:
            sdk = await e2b.AsyncSandbox.create(
                template=spec.image or DEFAULT_TEMPLATE, timeout=lifetime,
                metadata=sandbox_labels(run_id, labels), envs=env or {},
                allow_internet_access=spec.network, api_key=key)
        except e2b.AuthenticationException as e:
            raise SandboxUnavailable(f"E2B refused the API key ({e}); check E2B_API_KEY"
                                     ) from None
        except Exception as e:  # noqa: BLE001 - SDK and transport errors alike: no sandbox
            raise SandboxError(f"E2B sandbox creation failed: {type(e).__name__}: {e}"
                               ) from None
        track(sdk.sandbox_id, lambda: _kill_blocking(sdk.sandbox_id))
        return cls(sdk, spec)

    def _check(self) -> None:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")

    async def _run(self, line: str, env: dict[str, str] | None, timeout: float
                   ) -> tuple[int, str, str]:
        """Run a shell line; a non-zero exit is a result, not an exception."""
        code, out, err, _ = await self._stream(line, env, timeout)
        return code, out, err

    async def _stream(self, line: str, env: dict[str, str] | None, timeout: float
                      ) -> tuple[int, str, str, bool]:
        """(exit code, stdout, stderr, over): the output is taken as it streams, at most
        STREAM_CAP bytes; past it the command is killed and `over` is True. No end within
        `timeout` raises the SDK's TimeoutException (the command killed)."""
        e2b = import_e2b()
        output = _Output()
        try:
            handle = await self.sdk.commands.run(
                line, background=True, envs=env or {}, timeout=timeout, retain_output=False,
                on_stdout=output.stdout, on_stderr=output.stderr)
            waiting = asyncio.ensure_future(handle.wait())
            capped = asyncio.ensure_future(output.over.wait())
            await asyncio.wait({waiting, capped}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            capped.cancel()
            if not waiting.done():
                await _abandon(handle, waiting)
                if not output.over.is_set():
                    raise e2b.TimeoutException(f"the command did not end within {timeout:g}s")
                return -1, *output.text(), True
            try:
                code = waiting.result().exit_code
            except e2b.CommandExitException as e:
                code = e.exit_code
        except e2b.NotFoundException as e:  # commands only 404 when the sandbox is gone
            raise SandboxClosed(f"E2B sandbox {self.id} is gone: {e}") from None
        return code, *output.text(), output.over.is_set()

    async def exec(self, cmd: str, timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None) -> ExecResult:
        self._check()
        e2b = import_e2b()
        timeout = timeout or self.spec.exec_timeout_s
        exec_id = uuid.uuid4().hex
        cwd = posixpath.normpath(posixpath.join(self.workdir, cwd or "."))
        start = time.monotonic()
        try:
            code, out, err, over = await self._stream(wrapper_line(cmd, cwd, timeout),
                                                      {**(env or {}), EXEC_ID_VAR: exec_id},
                                                      timeout + BACKSTOP_S)
        except e2b.TimeoutException:
            await self._sweep(exec_id)
            return ExecResult(-1, "", f"envhub: killed after {timeout:g}s (timeout)", True)
        if over:  # written around the wrapper's cap: its writers die with it
            await self._sweep(exec_id)
            return ExecResult(code, out, f"{err}\n{OVER_CAP}", False)
        elapsed = time.monotonic() - start
        hit = timed_out(code, elapsed, timeout)
        if hit:
            await self._sweep(exec_id)
            err += f"\nenvhub: killed after {elapsed:.1f}s (timeout)"
        return ExecResult(code, out, err, hit)

    async def _sweep(self, exec_id: str) -> None:
        import shlex

        await self._run(shlex.join(["sh", "-c", SWEEP, "envhub-sweep", exec_id]), None, 60)

    async def end_processes(self) -> str:
        """Kill every process a wrapped exec started (E2B's own agent, envd, shares the
        sandbox, so it cannot be "everything but init" as in docker)."""
        import shlex

        self._check()
        await self._run(shlex.join(["sh", "-c", SWEEP_TAGGED, "envhub-sweep-tagged"]), None, 60)
        return "swept"

    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        self._check()
        e2b = import_e2b()
        target = self._abs(path)
        # the size first (the SDK's read buffers the whole file); nothing runs in the sandbox
        # by grading time (end_processes), so it cannot grow between the two calls
        code, out, _ = await self._run(f"stat -L -c %s {shlex.quote(target)}", None, 60)
        # ASCII digits only, bounded: `stat` is the agent's to replace (isdigit() takes '²',
        # which int() refuses, and int() of 5,000 digits raises)
        size = out.strip()
        if code == 0 and re.fullmatch(r"[0-9]{1,19}", size) and int(size) > limit:
            raise FileTooLarge(target, int(size), limit)
        try:
            data = bytes(await self.sdk.files.read(target, format="bytes"))
            if len(data) > limit:
                raise FileTooLarge(target, len(data), limit)
            return data
        except e2b.NotFoundException as e:
            raise SandboxFileError(f"{path}: no such file in the sandbox ({e})") from None
        except e2b.InvalidArgumentException as e:
            raise SandboxFileError(f"cannot read {path}: {e}") from None

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._check()
        e2b = import_e2b()
        target = self._abs(path)
        try:
            await self.sdk.files.write(target, data)
        except (e2b.InvalidArgumentException, e2b.NotFoundException) as e:
            raise SandboxFileError(f"cannot write {path}: {e}") from None
        if mode != 0o644:
            await self._run(f"chmod {mode:o} '{target}'", None, 60)

    async def upload(self, local_path: str, remote_path: str) -> None:
        """A file is written directly; a tree travels as a tar unpacked in the sandbox."""
        self._check()
        source = Path(local_path)
        if source.is_file():
            await self.write_file(remote_path, source.read_bytes(), source.stat().st_mode & 0o777)
            return
        target = self._abs(remote_path)
        data = await asyncio.to_thread(tar_path, source, posixpath.basename(target))
        staging = f"{self.workdir}/.envhub-upload-{uuid.uuid4().hex}.tar"
        await self.write_file(staging, data)
        code, _, err = await self._run(
            f"mkdir -p '{posixpath.dirname(target)}' && tar -xf '{staging}' -C "
            f"'{posixpath.dirname(target)}'; rc=$?; rm -f '{staging}'; exit $rc", None, 600)
        if code != 0:
            raise SandboxFileError(f"unpacking the upload to {target} failed: {err.strip()}")

    async def download(self, remote_path: str, local_path: str) -> None:
        self._check()
        source = self._abs(remote_path)
        staging = f"{self.workdir}/.envhub-download-{uuid.uuid4().hex}.tar"
        code, _, err = await self._run(
            f"tar -cf '{staging}' -C '{posixpath.dirname(source)}' "
            f"'{posixpath.basename(source)}'", None, 600)
        if code != 0:
            raise SandboxFileError(f"{remote_path}: cannot pack it for download: {err.strip()}")
        try:
            raw = await self.read_file(staging, limit=MAX_DOWNLOAD_BYTES)
        finally:
            await self._run(f"rm -f '{staging}'", None, 60)
        await asyncio.to_thread(extract_as, raw, Path(local_path))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        untrack(self.id)
        try:
            await self.sdk.kill()
        except Exception as e:  # noqa: BLE001 - already gone is fine; reap() is the backstop
            import logging

            logging.getLogger(__name__).warning("killing E2B sandbox %s failed: %s", self.id, e)


class _Output:
    """One command's stdout and stderr as the SDK hands them over (decoded text), kept up to
    STREAM_CAP bytes in all; past it `over` is set and the rest is dropped, each stream then
    cut to MAX_STREAM_BYTES (as docker's `_read_capped`)."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.size = 0
        self.over = asyncio.Event()

    def stdout(self, text: str) -> None:
        self._take(self.out, text)

    def stderr(self, text: str) -> None:
        self._take(self.err, text)

    def _take(self, into: list[str], text: str) -> None:
        if self.over.is_set():
            return
        into.append(text)
        self.size += len(text) if text.isascii() else len(text.encode())
        if self.size > STREAM_CAP:
            self.over.set()

    def text(self) -> tuple[str, str]:
        out, err = "".join(self.out), "".join(self.err)
        if not self.over.is_set():
            return out, err
        return _cut(out), _cut(err)


def _cut(text: str) -> str:
    data = text.encode()
    return text if len(data) <= MAX_STREAM_BYTES else \
        data[:MAX_STREAM_BYTES].decode(errors="ignore")


async def _abandon(handle: Any, waiting: asyncio.Future) -> None:
    """Kill a command and stop reading it (its tagged children are the sweep's)."""
    with contextlib.suppress(Exception):
        await handle.kill()
    with contextlib.suppress(Exception):
        await handle.disconnect()
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


def reap_e2b(run_id: str | None = None, stale_only: bool = False) -> list[str]:
    """Kill envhub-labelled E2B sandboxes (of `run_id`, or all; `stale_only`: owner dead).
    A no-op returning [] when the SDK or E2B_API_KEY is missing."""
    if not os.environ.get("E2B_API_KEY"):
        return []
    try:
        e2b = import_e2b()
    except SandboxUnavailable:
        return []
    from e2b.sandbox.sandbox_api import SandboxQuery

    wanted = {LABEL_SANDBOX: "1", **({LABEL_RUN: run_id} if run_id else {})}
    paginator = e2b.Sandbox.list(query=SandboxQuery(metadata=wanted), api_key=_api_key())
    killed = []
    while paginator.has_next:
        for info in paginator.next_items():
            if stale_only and owner_alive((info.metadata or {}).get(LABEL_OWNER, "")):
                continue
            e2b.Sandbox.kill(info.sandbox_id, api_key=_api_key())
            untrack(info.sandbox_id)
            killed.append(info.sandbox_id)
    return killed
