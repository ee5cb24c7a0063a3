"""The in-sandbox daemon (`envd`, port 49983) for the calls the Python SDK makes:

* HTTP: GET /health, GET /files?path= (download), POST /files?path= (upload, octet-stream
  or multipart). Errors: `{"code": ..., "message": ...}`.
* Connect RPC `process.Process`: Start (server stream: start, data, end, keepalive events),
  SendSignal, List — served by the SDK's own generated ASGI application, so the wire
  format is exactly the protobuf/Connect the SDK expects.
* Connect RPC `filesystem.Filesystem`: mounted, but every method answers UNIMPLEMENTED
  (the SDK's files.list/exists/make_dir/remove/watch use it; envhub does not).

The SDK names the sandbox in the `E2b-Sandbox-Id` header (it sends one base URL for all
sandboxes when E2B_SANDBOX_URL is set), and its token in `X-Access-Token`.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import email.policy
import itertools
import os
import shlex
import signal
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem.filesystem_connect import Filesystem, FilesystemASGIApplication
from e2b.envd.process import process_pb
from e2b.envd.process.process_connect import Process, ProcessASGIApplication
from protobuf import Oneof
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from envhub.envs.sandbox.e2b_fake.state import HOME, FakeSandbox, Registry
from envhub.envs.sandbox.errors import SandboxFileError
from envhub.envs.sandbox.local import BASE_ENV

KEEPALIVE_S = 30.0
DEFAULT_COMMAND_TIMEOUT_S = 3600.0


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


async def _sandbox_for(registry: Registry, headers: Mapping[str, str]
                       ) -> FakeSandbox | str:
    """The sandbox a request addresses, or an error message."""
    sandbox_id = headers.get("e2b-sandbox-id")
    if not sandbox_id:
        return "missing the E2b-Sandbox-Id header"
    sandbox = await registry.get(sandbox_id)
    if sandbox is None:
        return f"sandbox {sandbox_id} not found (killed or timed out)"
    if headers.get("x-access-token") != sandbox.access_token:
        return "unauthorized: bad X-Access-Token"
    return sandbox


def _event(**kwargs: object) -> process_pb.StartResponse:
    (name, value), = kwargs.items()
    # The oneof's (name, type) pairing is checked by the encoder at run time.
    oneof: Any = Oneof(name, value)
    return process_pb.StartResponse(event=process_pb.ProcessEvent(event=oneof))


class ProcessService(Process):
    """`process.Process` over the fake's LocalSandboxes. Like the real envd, a command's output
    is streamed as it is written, uncapped (the client's to bound), and a command never outlives
    its stream, its timeout or a SendSignal."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.pids = itertools.count(1000)
        self.running: dict[tuple[str, int], tuple[asyncio.subprocess.Process, list[str]]] = {}

    async def _sandbox(self, ctx: object) -> FakeSandbox:
        found = await _sandbox_for(self.registry, ctx.request_headers)  # type: ignore[attr-defined]
        if isinstance(found, str):
            code = Code.UNAUTHENTICATED if found.startswith("unauthorized") else Code.NOT_FOUND
            raise ConnectError(code, found)
        return found

    async def start(self, request: process_pb.StartRequest, ctx: object
                    ) -> AsyncIterator[process_pb.StartResponse]:
        sandbox = await self._sandbox(ctx)
        config = request.process
        if config is None or not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is required")
        argv = [config.cmd, *config.args]
        shell = os.path.basename(argv[0]) in ("bash", "sh") and len(argv) >= 3 \
            and argv[-2] == "-c"
        cmd = argv[-1] if shell else shlex.join(argv)
        cwd = sandbox.to_local(config.cwd if config.has_field("cwd") else HOME)
        timeout_ms = ctx.timeout_ms  # type: ignore[attr-defined]
        timeout = timeout_ms / 1000 if timeout_ms else DEFAULT_COMMAND_TIMEOUT_S
        proc, (out, err) = await _spawn(sandbox, cmd, cwd,
                                        {**sandbox.env_vars, **dict(config.envs)})
        pid = next(self.pids)
        self.running[(sandbox.id, pid)] = (proc, argv)
        chunks: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=8)
        pumps = [asyncio.create_task(_pump(out, "stdout", chunks)),
                 asyncio.create_task(_pump(err, "stderr", chunks))]
        try:
            yield _event(start=process_pb.ProcessEvent.StartEvent(pid=pid))
            async for item in _until_closed(chunks, len(pumps), proc, timeout):
                if item is None:
                    yield _event(keepalive=process_pb.ProcessEvent.KeepAlive())
                    continue
                data: Any = Oneof(*item)
                yield _event(data=process_pb.ProcessEvent.DataEvent(output=data))
            code = await proc.wait()
            if code < 0:  # killed: by SendSignal or its timeout
                yield _event(end=process_pb.ProcessEvent.EndEvent(
                    exit_code=-1, exited=False, status="signal: killed"))
                return
            yield _event(end=process_pb.ProcessEvent.EndEvent(
                exit_code=code, exited=True, status=f"exit status {code}"))
        finally:
            # Client gone or stream done: a command must never outlive its stream here.
            _killpg(proc)
            for pump in pumps:
                pump.cancel()
            self.running.pop((sandbox.id, pid), None)

    async def send_signal(self, request: process_pb.SendSignalRequest, ctx: object
                          ) -> process_pb.SendSignalResponse:
        sandbox = await self._sandbox(ctx)
        selector = request.process.selector if request.process else None
        match selector:
            case Oneof(field="pid", value=int(pid)) if (sandbox.id, pid) in self.running:
                _killpg(self.running[(sandbox.id, pid)][0])
                return process_pb.SendSignalResponse()
        raise ConnectError(Code.NOT_FOUND, f"process {selector} not found")

    async def list(self, request: process_pb.ListRequest, ctx: object
                   ) -> process_pb.ListResponse:
        sandbox = await self._sandbox(ctx)
        infos = [process_pb.ProcessInfo(pid=pid, config=process_pb.ProcessConfig(
                     cmd=argv[0], args=argv[1:]))
                 for (sid, pid), (_, argv) in self.running.items() if sid == sandbox.id]
        return process_pb.ListResponse(processes=infos)


async def _spawn(sandbox: FakeSandbox, cmd: str, cwd: str, env: dict[str, str]
                 ) -> tuple[asyncio.subprocess.Process, list[asyncio.StreamReader]]:
    """`cmd` started in the sandbox (state.py: joining its namespaces), and readers of its
    stdout and stderr as they are written (no wrapper, no cap: envd does not cap either).
    OS pipes, as envd's (asyncio's own are socket pairs)."""
    local = sandbox.local
    full_env = {**BASE_ENV, "HOME": local.workdir, **env}
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *sandbox.argv(cmd, cwd, full_env), stdin=asyncio.subprocess.DEVNULL,
            stdout=out_w, stderr=err_w,
            cwd=str(local.host_dir) if local.bwrap is None else None,
            env=full_env if local.bwrap is None else BASE_ENV, start_new_session=True)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return proc, [await _reader(out_r), await _reader(err_r)]


async def _reader(fd: int) -> asyncio.StreamReader:
    """A stream over the read end `fd` (closed with it at EOF)."""
    reader = asyncio.StreamReader(limit=1 << 16)
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
    return reader


async def _pump(stream: asyncio.StreamReader, name: str,
                chunks: asyncio.Queue[tuple[str, bytes] | None]) -> None:
    while chunk := await stream.read(1 << 16):
        await chunks.put((name, chunk))
    await chunks.put(None)


async def _until_closed(chunks: asyncio.Queue[tuple[str, bytes] | None], streams: int,
                        proc: asyncio.subprocess.Process, timeout: float
                        ) -> AsyncIterator[tuple[str, bytes] | None]:
    """Each output chunk until both pipes close; None for a keepalive. Past `timeout` the
    process group is killed (its pipes close then)."""
    deadline = time.monotonic() + timeout
    while streams:
        left = deadline - time.monotonic()
        try:
            item = await asyncio.wait_for(chunks.get(), max(0.0, min(KEEPALIVE_S, left)))
        except TimeoutError:
            if left <= 0:
                _killpg(proc)
                deadline = float("inf")  # the pipes close now; read them to the end
            else:
                yield None
            continue
        if item is None:
            streams -= 1
        else:
            yield item


def _killpg(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


class FilesystemService(Filesystem):
    """Every method answers UNIMPLEMENTED (the Protocol's defaults)."""


def _multipart_files(content_type: str, body: bytes) -> list[tuple[str | None, bytes]]:
    """(filename, data) of each part of a multipart/form-data body (stdlib parser: the fake
    needs no python-multipart)."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    files = []
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        files.append((part.get_filename(), payload if isinstance(payload, bytes) else b""))
    return files


def routes(registry: Registry) -> list[Route]:
    async def health(request: Request) -> Response:
        return Response(status_code=204)

    async def download(request: Request) -> Response:
        found = await _sandbox_for(registry, request.headers)
        if isinstance(found, str):
            return _error(401 if found.startswith("unauthorized") else 502, found)
        path = request.query_params.get("path")
        if not path:
            return _error(400, "the `path` query parameter is required")
        try:
            data = await found.local.read_file(found.to_local(path))
        except SandboxFileError as e:
            status = 404 if "no such file" in str(e) else 400
            return _error(status, f"{path}: {e}")
        return Response(data, media_type="application/octet-stream")

    async def upload(request: Request) -> Response:
        found = await _sandbox_for(registry, request.headers)
        if isinstance(found, str):
            return _error(401 if found.startswith("unauthorized") else 502, found)
        path = request.query_params.get("path")
        content_type = request.headers.get("content-type", "")
        body = await request.body()
        if content_type.startswith("multipart/form-data"):
            parts = _multipart_files(content_type, body)
            files = [(path if path and len(parts) == 1 else name, data) for name, data in parts]
        else:
            files = [(path, body)]
        written = []
        for name, data in files:
            if not name:
                return _error(400, "the `path` query parameter (or a part filename) is required")
            target = name if name.startswith("/") else f"{HOME}/{name}"
            try:
                await found.local.write_file(found.to_local(target), data)
            except SandboxFileError as e:
                return _error(400, f"{target}: {e}")
            written.append({"name": os.path.basename(target), "type": "file", "path": target})
        return JSONResponse(written)

    return [
        Route("/health", health, methods=["GET"]),
        Route("/files", download, methods=["GET"]),
        Route("/files", upload, methods=["POST"]),
    ]


def rpc_apps(registry: Registry) -> dict[str, object]:
    """ASGI apps of the Connect services, by path prefix."""
    return {
        "/process.Process/": ProcessASGIApplication(ProcessService(registry)),
        "/filesystem.Filesystem/": FilesystemASGIApplication(FilesystemService()),
    }
