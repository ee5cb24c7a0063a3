"""The host end of an in-sandbox agent's way out: a Unix socket per rollout, bound into its
sandbox, that forwards HTTP requests to that rollout's gateway session and nowhere else.

Each request's head is rewritten: only `/v1/...` paths (OpenAI, Anthropic and Responses
routes of a session) are let through, every credential the agent sent is dropped and the
session's own key put in its place, and the connection closes after one response. So the
agent never holds a key that works outside its sandbox (it is given a placeholder), cannot
reach admin or other sessions' routes, and has no other network at all. What an agent can make
the host hold is bounded too: at most MAX_CONNECTIONS open at once (429 beyond), and a request
head must arrive within HEAD_TIMEOUT_S (408), so connections that never speak are closed.

One path is answered on the host instead of forwarded: `POST /mcp`, the rollout's environment
tools as an MCP server (envs/mcp/server.py), when the runner attached one (`serve_mcp`). It
acts on this rollout only (the socket is this rollout's); its body is read here, bounded in
bytes (MCP_MAX_BODY_BYTES, 413) and time (the head timeout, 408); at most MCP_MAX_IN_FLIGHT
such requests are served at once (429 beyond), each answer bounded in time (the server's
`respond_timeout_s`); `GET`/`DELETE /mcp` answer 405 (the server is stateless: no event
stream, no session to end). When the tools could not be served (`mcp_unavailable`: the SDK
missing, say), `/mcp` answers 503 with the reason and `mcp_unavailable_hits` counts it: the
runner then drops the rollout (env_failure) rather than grade an agent denied its tools.
This module must not import the MCP SDK (it is optional).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SOCKET_NAME = "gateway.sock"
PLACEHOLDER_KEY = "envhub-sandboxed"  # what the agent sees: worthless anywhere else
MAX_HEAD_BYTES = 64 << 10
MAX_CONNECTIONS = 64  # one agent's model calls in flight; a real agent needs a handful
HEAD_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 30.0  # the agent must read the answer it asked for
ALLOWED_PREFIX = b"/v1/"
MCP_PATH = b"/mcp"
MCP_MAX_BODY_BYTES = 256 << 10  # one JSON-RPC message of a tool call; longer: 413
MCP_MAX_IN_FLIGHT = 4  # /mcp requests served at once per rollout (calls run one at a time)
DROPPED = {b"authorization", b"x-api-key", b"host", b"connection", b"keep-alive",
           b"proxy-authorization", b"proxy-connection", b"upgrade"}


class SessionChannel:
    """Serves `folder/gateway.sock` until `close()`; `folder` is bound into the sandbox."""

    def __init__(self, folder: Path, gateway_url: str, api_key: str, *,
                 max_connections: int = MAX_CONNECTIONS,
                 head_timeout_s: float = HEAD_TIMEOUT_S) -> None:
        parts = urlsplit(gateway_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"in-sandbox agents need an http:// gateway, not {gateway_url!r}")
        self.folder, self.key = folder, api_key
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/").encode()
        self.max_connections, self.head_timeout_s = max_connections, head_timeout_s
        self.requests = 0  # forwarded
        self.refused = 0
        self.open = 0  # connections being served now
        self.mcp: Any = None  # the rollout's tools over MCP (envs/mcp/server.py ToolServer)
        self.mcp_requests = 0  # answered by it
        self.mcp_in_flight = 0
        self.mcp_unavailable: str | None = None  # why the tools are not served (503)
        self.mcp_unavailable_hits = 0  # /mcp requests answered 503
        self._server: asyncio.AbstractServer | None = None
        self._closed = False

    @property
    def socket_path(self) -> Path:
        return self.folder / SOCKET_NAME

    async def start(self) -> SessionChannel:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o755)
        self._server = await asyncio.start_unix_server(self._handle, str(self.socket_path))
        self.socket_path.chmod(0o666)  # the agent may run as any user inside
        return self

    def serve_mcp(self, server: Any) -> None:
        """Answer `/mcp` from `server` (started; closed with the channel) from now on."""
        self.mcp = server

    def refuse_mcp(self, reason: str) -> None:
        """Answer `/mcp` with 503 and `reason`: the tools exist but cannot be served."""
        self.mcp_unavailable = reason

    async def close(self) -> None:
        """Stop serving (the tool server too). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.mcp is not None:
            server, self.mcp = self.mcp, None
            await server.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None
        shutil.rmtree(self.folder, ignore_errors=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            if self.open > self.max_connections:
                self.refused += 1
                return await _answer(writer, 429, f"more than {self.max_connections} "
                                     "connections open to the gateway from this sandbox")
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                              self.head_timeout_s)
            except TimeoutError:
                return await _answer(writer, 408, f"no request head within "
                                     f"{self.head_timeout_s:g}s")
            except asyncio.LimitOverrunError:
                return await _answer(writer, 431, "request head too large")
            except asyncio.IncompleteReadError:
                return None
            parsed = _parse_head(head)
            if parsed is not None and parsed.target.partition(b"?")[0] == MCP_PATH:
                return await self._serve_mcp(reader, writer, parsed)
            request = None if parsed is None else self._rewrite(parsed)
            if request is None:
                self.refused += 1
                return await _answer(writer, 403, "only this session's /v1/ routes and "
                                     "its environment's tools at /mcp are reachable from the "
                                     "sandbox")
            try:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                return await _answer(writer, 502, "the gateway is not reachable")
            self.requests += 1
            up_writer.write(request)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (ConnectionError, OSError):
            pass
        finally:
            self.open -= 1
            with contextlib.suppress(Exception):
                writer.close()
        return None

    async def _serve_mcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         head: Head) -> None:
        server = self.mcp
        if server is None and self.mcp_unavailable is not None:
            self.mcp_unavailable_hits += 1
            return await _answer(writer, 503, "the environment's tools cannot be served: "
                                 + self.mcp_unavailable)
        if server is None:
            self.refused += 1
            return await _answer(writer, 404, "this rollout serves no environment tools over "
                                 "MCP (its environment has none, or the agent phase is over)")
        if head.method != b"POST":
            return await _answer(writer, 405, "the environment's MCP server is stateless: "
                                 "POST only (no event stream, no session to end)")
        if self.mcp_in_flight >= MCP_MAX_IN_FLIGHT:
            self.refused += 1
            return await _answer(writer, 429, f"more than {MCP_MAX_IN_FLIGHT} requests to the "
                                 "environment's tools at once; its calls run one at a time")
        self.mcp_in_flight += 1
        try:
            return await self._answer_mcp(server, reader, writer, head)
        finally:
            self.mcp_in_flight -= 1

    async def _answer_mcp(self, server: Any, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter, head: Head) -> None:
        try:
            body = await asyncio.wait_for(_read_body(reader, head.headers), self.head_timeout_s)
        except TimeoutError:
            return await _answer(writer, 408, f"no request body within {self.head_timeout_s:g}s")
        except BodyTooLarge as e:
            self.refused += 1
            return await _answer(writer, 413, str(e))
        except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            self.refused += 1
            return await _answer(writer, 400, "a request body that is not what its head says")
        self.mcp_requests += 1
        try:
            await asyncio.wait_for(server.respond(head.method.decode(), head.target.decode(),
                                                  head.headers, body, writer),
                                   server.respond_timeout_s)
        except TimeoutError:  # a call that overran, or an agent that does not read its answer
            return None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT_S)
        return None

    def _rewrite(self, head: Head) -> bytes | None:
        """The request head as sent to the gateway, or None when it is not allowed."""
        target = head.target
        if not target.startswith(ALLOWED_PREFIX) or b".." in target or b"%" in target:
            return None
        kept = [b" ".join([head.method, self.prefix + target, head.version])]
        kept += [name + b": " + value for name, value in head.headers if name not in DROPPED]
        key = self.key.encode()
        kept += [b"Host: " + f"{self.host}:{self.port}".encode(),
                 b"Authorization: Bearer " + key, b"x-api-key: " + key,
                 b"Connection: close"]
        return b"\r\n".join(kept) + b"\r\n\r\n"


class BodyTooLarge(ValueError):
    pass


@dataclass
class Head:
    method: bytes
    target: bytes
    version: bytes
    headers: list[tuple[bytes, bytes]]  # names lowercased, values stripped


def _parse_head(head: bytes) -> Head | None:
    """The parts of a well-formed request head, else None."""
    if len(head) > MAX_HEAD_BYTES:
        return None
    lines = head[:-4].split(b"\r\n")
    words = lines[0].split(b" ")
    if len(words) != 3 or not words[2].startswith(b"HTTP/1."):
        return None
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers.append((name.strip().lower(), value.strip()))
    return Head(words[0], words[1], words[2], headers)


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request body by Content-Length or chunked, at most MCP_MAX_BODY_BYTES."""
    fields = dict(headers)
    too_big = BodyTooLarge(f"request body over {MCP_MAX_BODY_BYTES} bytes")
    if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
        body = bytearray()
        while True:
            size = int(((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0]).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are sent by MCP clients
                return bytes(body)
            if len(body) + size > MCP_MAX_BODY_BYTES:
                raise too_big
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    length = int(fields.get(b"content-length", b"0") or b"0")
    if length > MCP_MAX_BODY_BYTES:
        raise too_big
    return await reader.readexactly(length) if length > 0 else b""


async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "envhub_channel"}}).encode()
    reason = {400: "Bad Request", 403: "Forbidden", 404: "Not Found",
              405: "Method Not Allowed", 408: "Request Timeout", 413: "Content Too Large",
              429: "Too Many Requests", 431: "Request Header Fields Too Large",
              502: "Bad Gateway", 503: "Service Unavailable"}[status]
    allow = "allow: POST\r\n" if status == 405 else ""
    writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n{allow}"
                 f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
    with contextlib.suppress(Exception):
        await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
