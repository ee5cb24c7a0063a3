"""The stdio transport to an MCP server inside a sandbox: the `mcp` SDK's framing (one JSON-RPC
message per line) over the pipes of the host command a sandbox gives (`StdioCommand`), with
every host-side read bounded, because the agent shares the sandbox and steers what the server
prints (a tool that returns a file the agent made 1 GiB long).

Unlike `mcp.client.stdio.stdio_client` (which buffers a line of any length and sends stderr to
a file): a message over `max_message` bytes ends the connection and kills the server (the
session's pending requests fail as "connection closed"), and only stderr's last bytes are kept.
Shutdown is the SDK's order: close stdin, wait, kill the process group; every wait bounded.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
from anyio.abc import Process

MAX_MESSAGE_BYTES = 8 << 20  # one JSON-RPC message from the server
STDERR_KEEP = 4096  # bytes of the server's stderr kept (its tail)
EXIT_GRACE_S = 2.0  # after stdin closes, before the kill


class ServerLog:
    """What the host knows of a server process: its stderr's tail, and why it was cut off."""

    def __init__(self) -> None:
        self.tail = bytearray()
        self.cut: str | None = None

    def add(self, chunk: bytes) -> None:
        self.tail += chunk
        del self.tail[:-STDERR_KEEP]

    def text(self) -> str:
        return self.tail.decode(errors="replace").strip()


@asynccontextmanager
async def sandbox_stdio(argv: list[str], env: dict[str, str], max_message: int = MAX_MESSAGE_BYTES
                        ) -> AsyncIterator[tuple[Any, Any, ServerLog]]:
    """(read stream, write stream, log) for a `ClientSession`, over `argv`'s pipes."""
    import mcp.types as types
    from mcp.shared.message import SessionMessage

    process = await anyio.open_process(argv, env=env, start_new_session=True)
    log = ServerLog()
    read_send, read_recv = anyio.create_memory_object_stream[Any](0)
    write_send, write_recv = anyio.create_memory_object_stream[Any](0)

    async def reader() -> None:
        assert process.stdout is not None
        buffer = bytearray()
        async with read_send:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for chunk in process.stdout:
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        line = bytes(buffer[:end])
                        del buffer[:end + 1]
                        if line.strip():
                            await read_send.send(_parse(types, SessionMessage, line))
                    if len(buffer) > max_message:
                        log.cut = f"it sent a message over {max_message} bytes"
                        _kill(process)
                        return

    async def writer() -> None:
        assert process.stdin is not None
        async with write_recv:
            try:
                async for message in write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode())
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await read_send.aclose()  # the session sees the connection end, not a hang

    async def errors() -> None:
        assert process.stderr is not None
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in process.stderr:
                log.add(chunk)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        tg.start_soon(errors)
        try:
            yield read_recv, write_send, log
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                for stream in (read_recv, write_send, read_send, write_recv):
                    await stream.aclose()
            tg.cancel_scope.cancel()


def _parse(types: Any, session_message: Any, line: bytes) -> Any:
    try:
        return session_message(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as e:  # the session surfaces it; the connection goes on
        return e


def _kill(process: Process) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def _stop(process: Process) -> None:
    """Close stdin, give the server EXIT_GRACE_S to leave, then kill its process group."""
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    with anyio.move_on_after(EXIT_GRACE_S):
        while process.returncode is None:
            await anyio.sleep(0.02)
    if process.returncode is None:
        _kill(process)
        with anyio.move_on_after(EXIT_GRACE_S):
            while process.returncode is None:
                await anyio.sleep(0.02)
    # closes the pipes and reaps the process, so its asyncio transport is closed on this
    # loop (not by the garbage collector after the loop is gone)
    with anyio.move_on_after(EXIT_GRACE_S):
        await process.aclose()
