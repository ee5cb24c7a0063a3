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
import email.parser
import email.policy
import itertools
import os
import shlex
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

from envhub.envs.sandbox.base import ExecResult
from envhub.envs.sandbox.e2b_fake.state import HOME, FakeSandbox, Registry
from envhub.envs.sandbox.errors import SandboxFileError

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
    """`process.Process` over the fake's LocalSandboxes (one-shot execs, output sent at end)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.pids = itertools.count(1000)
        self.running: dict[tuple[str, int], tuple[asyncio.Task[ExecResult], list[str]]] = {}

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
        env = {**sandbox.env_vars, **dict(config.envs)}
        pid = next(self.pids)
        task = asyncio.create_task(sandbox.local.exec(cmd, timeout=timeout, cwd=cwd, env=env))
        self.running[(sandbox.id, pid)] = (task, argv)
        try:
            yield _event(start=process_pb.ProcessEvent.StartEvent(pid=pid))
            while True:
                done, _ = await asyncio.wait({task}, timeout=KEEPALIVE_S)
                if done:
                    break
                yield _event(keepalive=process_pb.ProcessEvent.KeepAlive())
            try:
                result = task.result()
            except asyncio.CancelledError:  # SendSignal killed it
                yield _event(end=process_pb.ProcessEvent.EndEvent(
                    exit_code=-1, exited=False, status="signal: killed"))
                return
            data = process_pb.ProcessEvent.DataEvent
            if result.stdout:
                out: Any = Oneof("stdout", result.stdout.encode())
                yield _event(data=data(output=out))
            if result.stderr:
                err: Any = Oneof("stderr", result.stderr.encode())
                yield _event(data=data(output=err))
            yield _event(end=process_pb.ProcessEvent.EndEvent(
                exit_code=result.exit_code, exited=True, status=f"exit status {result.exit_code}"))
        finally:
            # Client gone or stream done: a command must never outlive its stream here.
            if not task.done():
                task.cancel()
            self.running.pop((sandbox.id, pid), None)

    async def send_signal(self, request: process_pb.SendSignalRequest, ctx: object
                          ) -> process_pb.SendSignalResponse:
        sandbox = await self._sandbox(ctx)
        selector = request.process.selector if request.process else None
        match selector:
            case Oneof(field="pid", value=int(pid)) if (sandbox.id, pid) in self.running:
                self.running[(sandbox.id, pid)][0].cancel()
                return process_pb.SendSignalResponse()
        raise ConnectError(Code.NOT_FOUND, f"process {selector} not found")

    async def list(self, request: process_pb.ListRequest, ctx: object
                   ) -> process_pb.ListResponse:
        sandbox = await self._sandbox(ctx)
        infos = [process_pb.ProcessInfo(pid=pid, config=process_pb.ProcessConfig(
                     cmd=argv[0], args=argv[1:]))
                 for (sid, pid), (_, argv) in self.running.items() if sid == sandbox.id]
        return process_pb.ListResponse(processes=infos)


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
