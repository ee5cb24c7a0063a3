"""The host end of an in-sandbox agent's way out: a Unix socket per rollout, bound into its
sandbox, that forwards HTTP requests to that rollout's gateway session and nowhere else.

Each request's head is rewritten: only `/v1/...` paths (OpenAI, Anthropic and Responses
routes of a session) are let through, every credential the agent sent is dropped and the
session's own key put in its place, and the connection closes after one response. So the
agent never holds a key that works outside its sandbox (it is given a placeholder), cannot
reach admin or other sessions' routes, and has no other network at all. What an agent can make
the host hold is bounded too: at most MAX_CONNECTIONS open at once (429 beyond), and a request
head must arrive within HEAD_TIMEOUT_S (408), so connections that never speak are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path
from urllib.parse import urlsplit

SOCKET_NAME = "gateway.sock"
PLACEHOLDER_KEY = "envhub-sandboxed"  # what the agent sees: worthless anywhere else
MAX_HEAD_BYTES = 64 << 10
MAX_CONNECTIONS = 64  # one agent's model calls in flight; a real agent needs a handful
HEAD_TIMEOUT_S = 30.0
ALLOWED_PREFIX = b"/v1/"
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
        self._server: asyncio.AbstractServer | None = None

    @property
    def socket_path(self) -> Path:
        return self.folder / SOCKET_NAME

    async def start(self) -> SessionChannel:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o755)
        self._server = await asyncio.start_unix_server(self._handle, str(self.socket_path))
        self.socket_path.chmod(0o666)  # the agent may run as any user inside
        return self

    async def close(self) -> None:
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
            request = self._rewrite(head)
            if request is None:
                self.refused += 1
                return await _answer(writer, 403, "only this session's /v1/ routes are "
                                     "reachable from the sandbox")
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

    def _rewrite(self, head: bytes) -> bytes | None:
        """The request head as sent to the gateway, or None when it is not allowed."""
        if len(head) > MAX_HEAD_BYTES:
            return None
        lines = head[:-4].split(b"\r\n")
        words = lines[0].split(b" ")
        if len(words) != 3 or not words[2].startswith(b"HTTP/1."):
            return None
        method, target, version = words
        if not target.startswith(ALLOWED_PREFIX) or b".." in target or b"%" in target:
            return None
        kept = [b" ".join([method, self.prefix + target, version])]
        for line in lines[1:]:
            name, sep, _ = line.partition(b":")
            if not sep or name.strip().lower() in DROPPED:
                continue
            kept.append(line)
        key = self.key.encode()
        kept += [b"Host: " + f"{self.host}:{self.port}".encode(),
                 b"Authorization: Bearer " + key, b"x-api-key: " + key,
                 b"Connection: close"]
        return b"\r\n".join(kept) + b"\r\n\r\n"


async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = ('{"error": {"message": "%s", "type": "envhub_channel"}}' % message).encode()
    reason = {403: "Forbidden", 408: "Request Timeout", 429: "Too Many Requests",
              431: "Request Header Fields Too Large", 502: "Bad Gateway"}[status]
    writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
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
