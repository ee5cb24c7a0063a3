"""An environment's own MCP servers (`[mcp.NAME]` in envhub.toml) as tools of the built-in agent.

Each server runs INSIDE the rollout's sandbox, the agent's own, so its tools act on the agent's
workspace and never on the host: the sandbox gives the host command line whose stdin/stdout
are the server's (`HostsStdio.stdio_command`: local = bubblewrap, in a pid namespace of its
own with the package's `files` bound for it alone; docker = `docker exec -i`; e2b cannot), and
the official `mcp` SDK's `ClientSession` speaks to it, over the SDK's line framing on that
command's pipes with every read bounded (transport.py).
Its tools are offered as `NAME__tool` (OpenAI function tools, `inputSchema` as `parameters`);
a call's content comes back as text, cut in the middle (envs/tools/truncation.py), `isError`
as an error result. The model's calls and the results it reads are recorded by the gateway
like any other tool's: they are in the next request.

Failure attribution. The servers start before the agent's first step, so a server that cannot
start, answer the handshake or list its tools (or lacks a tool the manifest names) fails on
its own: `EnvFailure` (the rollout is dropped, with the reason and its stderr's tail). Once the
agent has acted, it shares the sandbox with the server: it can feed it inputs that crash it,
fill the disk under it, rewrite the files it reads, and in docker kill it (`pkill`). A server
that dies or hangs after that is therefore NOT an env failure (the agent must not be able to
turn a failing rollout into a dropped sample): the call returns an error result, the server's
tools answer so for the rest of the rollout, and the rollout is graded as usual. So is an
answer the SDK refuses (a result that breaks the tool's outputSchema, a request the server
makes of the client): the call's error, and the server goes on. The sessions live in a task
of their own (`McpTools._own`), so a session task that crashes kills its servers, never the
rollout's task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from envhub.envs.environment import EnvFailure
from envhub.envs.manifest import TOOL_NAME_RE, Manifest, McpServerSpec
from envhub.envs.sandbox.base import HostsStdio, Sandbox
from envhub.envs.tools.result import ToolResult
from envhub.envs.tools.truncation import cut_middle

log = logging.getLogger(__name__)

FILES_ROOT = "/run/envhub-mcp"  # a server's `files` appear at FILES_ROOT/NAME/<path>
MAX_TOOLS = 128  # per server; an environment offering more is refused
MAX_PAGES = 16  # of a tools/list answer
MAX_SCHEMA_CHARS = 32_000  # one tool's input schema, as JSON
MAX_DESCRIPTION_CHARS = 2_000
CLOSE_TIMEOUT_S = 30.0  # every server's stop is bounded (transport.py); this bounds them all
CONNECTION_CLOSED = -32000  # the SDK's codes: the connection ended under a request,
REQUEST_TIMEOUT = -32001  # the request's read timeout passed
# a stream of the transport ended under a call (the server is gone)
ANYIO_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)


MIN_VERSION = (2, 3)  # mcp.MCPError, mcp_types, the lowlevel Server's on_* handlers


class McpMissing(EnvFailure):
    """The `mcp` SDK is not installed, or too old: this machine's setup, not the agent's."""


def import_mcp(needed_for: str = "the environment declares [mcp] servers") -> Any:
    """The `mcp` SDK (2.3 or later), or McpMissing saying how to install it."""
    fix = "pip install 'envhub[mcp]'"
    try:
        import mcp
    except ImportError as e:
        raise McpMissing(f"{needed_for}: install the MCP SDK ({fix}): {e}") from None
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("mcp")
    except PackageNotFoundError:
        found = "unknown"
    parts = [int(x) for x in found.split(".")[:2] if x.isdigit()]
    if len(parts) < 2 or tuple(parts) < MIN_VERSION or not hasattr(mcp, "MCPError"):
        raise McpMissing(f"{needed_for}: the MCP SDK here is version {found}, and envhub needs "
                         f"{'.'.join(map(str, MIN_VERSION))} or later ({fix})")
    return mcp


@dataclass
class McpTool:
    server: str
    name: str  # the server's own name
    schema: dict[str, Any]  # what the agent is offered (OpenAI function tool)


class McpServer:
    """One running server: its session (inside McpTools' exit stack) and what its stderr said."""

    def __init__(self, name: str, spec: McpServerSpec, session: Any, log: Any) -> None:
        self.name, self.spec, self.session, self.log = name, spec, session, log
        self.dead: str | None = None  # why its tools no longer answer


class McpTools:
    """The MCP servers of one rollout: `start` them (EnvFailure when one cannot), offer their
    `schemas`, `call` a tool by its offered name (from any task), `aclose` (always; stops
    every server).

    The servers' sessions and transports (anyio task groups) live in a task of their own,
    `_own`, from `start` to `aclose`: a session's task that crashes ends that task (the servers
    are then dead for the calls that follow), never the rollout's task that started them."""

    def __init__(self, manifest: Manifest, sandbox: Sandbox,
                 package_root: Path | None) -> None:
        self.manifest, self.sandbox, self.package_root = manifest, sandbox, package_root
        self.tools: dict[str, McpTool] = {}  # offered name -> tool
        self.servers: dict[str, McpServer] = {}
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    async def start(self) -> None:
        """Start every declared server, in the order declared, and list its tools."""
        if not isinstance(self.sandbox, HostsStdio):
            kind = getattr(self.sandbox, "kind", type(self.sandbox).__name__)
            raise EnvFailure(f"the environment's [mcp] servers run inside the sandbox, and a "
                             f"{kind} sandbox cannot host one (no long-lived process with "
                             "pipes); run with --sandbox local or docker")
        import_mcp()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(self.sandbox, ready))
        try:
            await asyncio.shield(ready)
        except asyncio.CancelledError:
            await self.aclose()
            raise

    async def _own(self, sandbox: HostsStdio, ready: asyncio.Future[None]) -> None:
        """Enter every server's session, then hold them until `aclose`."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    for name, spec in self.manifest.mcp.items():
                        await self._start_one(stack, name, spec, sandbox)
                except Exception as e:  # noqa: BLE001 - `start` raises it; the stack exits
                    # cleanly (raised through it, the sessions' task groups would wrap it)
                    ready.set_exception(e)
                    return
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - said to `start`, or to the calls after
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else EnvFailure(
                    f"the MCP servers were stopped while starting ({type(e).__name__})"))
            elif not self._stop.is_set():
                log.warning("the MCP servers' task ended: %s: %s", type(e).__name__, e)
            if not isinstance(e, Exception):
                raise
        finally:
            for server in self.servers.values():
                server.dead = server.dead or dead_message(server)

    async def _start_one(self, stack: contextlib.AsyncExitStack, name: str,
                         spec: McpServerSpec, sandbox: HostsStdio) -> None:
        mcp = import_mcp()
        from envhub.envs.mcp.transport import ServerLog, sandbox_stdio

        command = await sandbox.stdio_command(
            spec.command, cwd=spec.cwd, env=spec.env, files=self._files(name, spec))
        log = ServerLog()
        try:
            read, write, log = await stack.enter_async_context(
                sandbox_stdio(command.argv, command.env))
            session = await stack.enter_async_context(
                mcp.ClientSession(read, write, read_timeout_seconds=spec.startup_timeout_s))
            self.servers[name] = McpServer(name, spec, session, log)
            await session.initialize()
            listed = await self._list(session)
        except (OSError, RuntimeError, ValueError, mcp.MCPError, *ANYIO_ERRORS) as e:
            why = f"; {log.cut}" if log.cut else ""
            tail = log.text()
            raise EnvFailure(f"MCP server [mcp.{name}] did not start: {type(e).__name__}: {e}"
                             + why + (f"; its stderr ends: {tail}" if tail else "")) from None
        if command.started is not None:
            await command.started()
        self._offer(name, spec, listed)

    def _files(self, name: str, spec: McpServerSpec) -> dict[str, str]:
        """host path -> sandbox path of the server's `files` (that they exist in the package
        is checked when it loads: envs/manifest.py)."""
        if spec.files and self.package_root is None:
            raise EnvFailure(f"[mcp.{name}] needs files of its package, and this agent was "
                             "not told where the package is (AgentContext.package_root)")
        return {str((self.package_root / rel).resolve()):  # type: ignore[operator]
                f"{FILES_ROOT}/{name}/{os.path.normpath(rel)}" for rel in spec.files}

    async def _list(self, session: Any) -> list[Any]:
        import mcp

        tools: list[Any] = []
        cursor = None
        for _ in range(MAX_PAGES):
            params = None if cursor is None else mcp.types.PaginatedRequestParams(cursor=cursor)
            page = await session.list_tools(params=params)
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None or len(tools) > MAX_TOOLS:
                break
        return tools

    def _offer(self, name: str, spec: McpServerSpec, listed: list[Any]) -> None:
        if len(listed) > MAX_TOOLS:
            raise EnvFailure(f"MCP server [mcp.{name}] lists more than {MAX_TOOLS} tools; "
                             "name the ones to offer in its `tools`")
        by_name = {t.name: t for t in listed}
        wanted = spec.tools if spec.tools is not None else list(by_name)
        missing = [t for t in wanted if t not in by_name]
        if missing:
            raise EnvFailure(f"envhub.toml: field 'mcp.{name}.tools': the server has no tool "
                             f"{missing[0]!r}; it lists {', '.join(by_name) or 'none'}")
        for tool_name in wanted:
            offered = self.manifest.mcp_tool_name(name, tool_name)
            if not TOOL_NAME_RE.match(offered):
                raise EnvFailure(f"MCP server [mcp.{name}] lists a tool {tool_name!r}, offered "
                                 f"as {offered!r}: not a valid function name (letters, digits, "
                                 "'_' or '-', at most 64 with the prefix); leave it out with "
                                 f"the server's `tools` or shorten its `prefix`")
            if offered in self.tools:
                raise EnvFailure(f"MCP tool name {offered!r} is offered twice; give [mcp.{name}] "
                                 "a `prefix` or leave one out with its `tools`")
            self.tools[offered] = McpTool(name, tool_name, openai_schema(
                offered, by_name[tool_name], f"[mcp.{name}]"))

    async def call(self, name: str, arguments: str) -> ToolResult:
        """One call by its offered name; every failure is a result for the model (see the
        module's docstring for why a dead server is not an env failure)."""
        import mcp

        tool = self.tools[name]
        server = self.servers[tool.server]
        args = parse_arguments(name, arguments)
        if isinstance(args, ToolResult):
            return args
        if server.dead is not None:
            return ToolResult(server.dead, is_error=True)
        try:
            result = await server.session.call_tool(
                tool.name, args, read_timeout_seconds=server.spec.call_timeout_s)
        except mcp.MCPError as e:
            if e.code == REQUEST_TIMEOUT:
                return ToolResult(f"`{name}` did not answer within "
                                  f"{server.spec.call_timeout_s:g}s; the call was abandoned",
                                  is_error=True)
            if e.code != CONNECTION_CLOSED:  # the server's own error answer
                return ToolResult(cut_middle(f"`{name}` failed: {e}"), is_error=True)
            server.dead = dead_message(server)
            return ToolResult(server.dead, is_error=True)
        except (OSError, *ANYIO_ERRORS):
            server.dead = dead_message(server)
            return ToolResult(server.dead, is_error=True)
        # What the server answered does not fit the protocol or the tool's own outputSchema
        # (the SDK raises RuntimeError, ValidationError, ...): the agent's inputs shape that
        # answer, so it is the call's error, and the server goes on serving.
        except Exception as e:  # noqa: BLE001
            if server.dead is not None or self._owner is None or self._owner.done():
                server.dead = server.dead or dead_message(server)
                return ToolResult(server.dead, is_error=True)
            return ToolResult(cut_middle(f"`{name}` failed: its answer was refused "
                                         f"({type(e).__name__}: {e})"), is_error=True)
        return ToolResult(cut_middle(result_text(result)), is_error=bool(result.is_error))

    async def aclose(self) -> None:
        """Stop every server (stdin closed, then its process group killed; every wait bounded,
        transport.py). Safe to call twice."""
        self.tools.clear()
        self._stop.set()
        owner, self._owner = self._owner, None
        if owner is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(owner), CLOSE_TIMEOUT_S)
        except asyncio.CancelledError:
            owner.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - its process is stopped all the same; the
            # rollout's outcome does not depend on how a session's tasks wound down
            owner.cancel()
            log.warning("stopping the MCP servers: %s: %s", type(e).__name__, e)


def dead_message(server: McpServer) -> str:
    why = f" ({server.log.cut})" if server.log.cut else ""
    return (f"the environment's MCP server `{server.name}` is no longer running{why}: it "
            "exited or was killed; its tools are unavailable for the rest of this task")


def openai_schema(offered: str, tool: Any, where: str) -> dict[str, Any]:
    """An OpenAI function tool for an MCP tool: its `inputSchema` as `parameters`."""
    parameters = dict(tool.input_schema or {})
    if parameters.get("type", "object") != "object":
        raise EnvFailure(f"MCP server {where}: tool {tool.name!r} takes a {parameters['type']!r}; "
                         "a tool's inputSchema must be an object schema")
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    if len(json.dumps(parameters)) > MAX_SCHEMA_CHARS:
        raise EnvFailure(f"MCP server {where}: tool {tool.name!r} has an input schema over "
                         f"{MAX_SCHEMA_CHARS} characters; simplify it or leave it out")
    description = tool.description or tool.title or tool.name
    return {"type": "function", "function": {
        "name": offered, "description": description[:MAX_DESCRIPTION_CHARS],
        "parameters": parameters}}


def parse_arguments(name: str, arguments: str) -> dict[str, Any] | ToolResult:
    """The model's JSON arguments as an object, or an error result saying how to send them."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as e:
        return ToolResult(f"arguments for `{name}` are not valid JSON ({e.msg} at position "
                          f"{e.pos}); send one JSON object", is_error=True)
    if not isinstance(value, dict):
        return ToolResult(f"arguments for `{name}` must be a JSON object", is_error=True)
    return value


def result_text(result: Any) -> str:
    """A CallToolResult as text: text parts as they are, anything else as a short note."""
    parts = []
    for item in result.content:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} ({item.mime_type}, {len(item.data) * 3 // 4} bytes) not "
                         "shown: this agent reads text only]")
        elif kind == "resource_link":
            parts.append(f"[resource: {item.uri}]")
        elif kind == "resource":
            text = getattr(item.resource, "text", None)
            parts.append(text if text is not None else
                         f"[resource {item.resource.uri} ({item.resource.mime_type}): binary, "
                         "not shown]")
        else:
            parts.append(f"[{kind or 'unknown'} content not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)
