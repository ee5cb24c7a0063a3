"""One rollout's environment tools as an MCP server, for a command agent inside its sandbox.

Claude Code, Codex, opencode and any MCP client use an environment's `submit`, search or
browser tools unchanged: the agent's existing channel (envs/agents/channel.py) answers
`POST /mcp` itself, on the host, from this server (MCP Streamable HTTP, stateless, JSON
responses: the official `mcp` SDK's lowlevel `Server` and its session manager); every other
path still goes to the rollout's gateway session or is refused. Nothing else is opened: inside
the sandbox the URL is the forwarder's, `http://127.0.0.1:4141/mcp` (`ENVHUB_MCP_URL`).

Which rollout a call acts on is not in the request: the channel is one Unix socket per
rollout, bound only into that rollout's sandbox, and its server is built for that rollout
(its task, the sandbox `setup` returned and the agent context's `state`). Calls go through the
same `Toolbox` the built-in agent uses, with the same per-rollout state, so an answer
submitted over MCP is the one `verify` grades. Tool calls run one at a time, their output is
cut to MAX_OUTPUT_CHARS, and the server stops when the agent phase ends, before grading.

The model's tool call and the tool's result need no recording here: the agent sends both to
the model in its next request, which the gateway records as a turn like any other.

Failure attribution. A tool that raises (a sandbox exec failed, the environment's code crashed)
answers the agent with an error either way. When the tool acts on the agent's own sandbox
(`shared`), the agent may have caused it (a fork bomb filling the pid limit, a 1 GiB file a
tool reads): it counts as a tool error (tool_error signal) and the rollout is graded, unless
the sandbox also fails a health probe after the agent exited (`failure_after_agent`): then
the infrastructure failed and the rollout is env_failure. A tool acting on a sandbox the agent
cannot reach (arith's in-process store) raising is always the environment's failure.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from http import HTTPStatus
from typing import Any

from envhub.envs.agents.channel import MCP_MAX_BODY_BYTES, MCP_MAX_IN_FLIGHT
from envhub.envs.agents.toolbox import Toolbox
from envhub.envs.environment import EnvFailure
from envhub.envs.mcp.client import import_mcp
from envhub.envs.tools.truncation import cut_middle

log = logging.getLogger(__name__)

SERVER_NAME = "envhub"  # Claude Code names the tools mcp__envhub__<tool>
CLIENT_PREFIX = f"mcp__{SERVER_NAME}__"
MAX_FUNCTION_NAME = 64  # characters of a function tool's name (OpenAI, Anthropic)
MAX_OUTPUT_CHARS = 64_000  # per call, head and tail kept
INSTRUCTIONS = ("The tools of this task's environment. Call submit (when offered) to hand in "
                "the answer: that is what is graded.")
DROPPED = {b"connection", b"keep-alive", b"transfer-encoding"}
CALL_TIMEOUT_S = 3600.0 + 60  # one tool call: the longest bash command a tool may run, + slack
DRAIN_TIMEOUT_S = 30.0  # the agent must read what it asked for
PROBE_TIMEOUT_S = 60.0  # the health probe of the agent's sandbox after the agent


class ToolServer:
    """Serves one rollout's tools over MCP until `close()`; `respond` answers one request."""

    def __init__(self, toolbox: Toolbox, state: dict[str, Any], session: Any = None, *,
                 shared: bool = False, call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.toolbox, self.state, self.session = toolbox, state, session
        self.shared = shared  # the tools act on the agent's own sandbox (see the docstring)
        self.call_timeout_s = call_timeout_s
        self.calls = 0  # tools/call requests answered
        self.errors = 0  # of which the tool reported an error
        self.submitted = False
        self.failure: BaseException | None = None  # the first exception a tool raised
        self._manager: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()  # one call at a time: tools share the rollout's state

    @property
    def respond_timeout_s(self) -> float:
        """How long one request may take: the calls queued before it, then its own."""
        return self.call_timeout_s * MCP_MAX_IN_FLIGHT + 30

    async def start(self) -> ToolServer:
        """Start the toolbox (the environment's own `[mcp]` servers too, as for the built-in
        agent: EnvFailure when one cannot start) and the MCP session manager."""
        await self.toolbox.start()
        for schema in self.toolbox.schemas:  # Claude Code calls them mcp__envhub__<name>
            name = schema["function"]["name"]
            if len(CLIENT_PREFIX + name) > MAX_FUNCTION_NAME:
                raise EnvFailure(f"tool {name!r} is too long a name to serve over MCP: clients "
                                 f"offer it as {CLIENT_PREFIX}{name}, over {MAX_FUNCTION_NAME} "
                                 "characters; shorten it (or its [mcp] server's `prefix`)")
        # the SDK takes ~1 s to import: once per process, off the event loop serving rollouts
        await asyncio.to_thread(import_mcp, "serving the environment's tools over MCP")
        await asyncio.to_thread(importlib.import_module, "mcp.server.streamable_http_manager")
        import mcp_types as types
        from mcp.server.lowlevel import Server
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        listed = [types.Tool(name=s["function"]["name"],
                             description=s["function"].get("description"),
                             input_schema=s["function"].get("parameters")
                             or {"type": "object", "properties": {}})
                  for s in self.toolbox.schemas]

        async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=listed)

        async def call_tool(_ctx: Any, params: types.CallToolRequestParams
                            ) -> types.CallToolResult:
            text, is_error = await self.call(params.name, params.arguments or {})
            return types.CallToolResult(content=[types.TextContent(text=text)],
                                        is_error=is_error)

        server: Any = Server(SERVER_NAME, instructions=INSTRUCTIONS,
                             on_list_tools=list_tools, on_call_tool=call_tool)
        local = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
        self._manager = StreamableHTTPSessionManager(
            server, json_response=True, stateless=True, max_request_body_size=MCP_MAX_BODY_BYTES,
            security_settings=TransportSecuritySettings(
                allowed_hosts=local, allowed_origins=[f"http://{h}" for h in local]))
        started = asyncio.Event()

        async def serve() -> None:
            async with self._manager.run():
                started.set()
                await self._stop.wait()

        self._task = asyncio.create_task(serve())
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait({self._task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():  # it could not start: say why
            self._task.result()
        return self

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 5)
            except Exception as e:  # noqa: BLE001 - stopping: nothing left to report
                log.debug("MCP tool server stopped: %s", e)
            self._task = None
        await self.toolbox.aclose()

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(text, is_error) of one call, dispatched as the built-in agent does."""
        async with self._lock:
            self.calls += 1
            try:
                out = await asyncio.wait_for(
                    self.toolbox.call(name, json.dumps(arguments), self.state),
                    self.call_timeout_s)
            # the sandbox failed or the environment's code crashed: kept, and judged after the
            # agent exited (`failure_after_agent`)
            except Exception as e:  # noqa: BLE001
                self.failure = self.failure or e
                self.errors += 1
                await self._signal(name, type(e).__name__)
                return f"the environment failed running {name!r} ({type(e).__name__})", True
            self.submitted = self.submitted or out.submitted
            if out.is_error:
                self.errors += 1
                if not out.unknown:  # the gateway records undeclared tools itself
                    await self._signal(name)
            text = cut_middle(out.content, MAX_OUTPUT_CHARS // 2, MAX_OUTPUT_CHARS // 2)
            return text, out.is_error

    async def failure_after_agent(self) -> BaseException | None:
        """The failure that ends the rollout as env_failure, once the agent exited: a tool's
        exception when its sandbox is out of the agent's reach, or when the agent's sandbox
        also fails a health probe now; None when the agent may have caused it (graded)."""
        if self.failure is None:
            return None
        if not self.shared:
            return self.failure
        try:
            probe = await asyncio.wait_for(self.toolbox.sandbox.exec("true", timeout=30),
                                           PROBE_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - the sandbox itself is broken: infrastructure
            log.warning("the sandbox failed its probe after the agent: %s: %s",
                        type(e).__name__, e)
            return self.failure
        if probe.exit_code != 0:
            return self.failure
        log.info("a tool raised %s in the agent's sandbox, which is healthy now: graded as "
                 "a tool error", type(self.failure).__name__)
        return None

    async def _signal(self, name: str, raised: str | None = None) -> None:
        """tool_error, as the built-in agent reports it (no turn: the server cannot tell which
        of the agent's turns asked for the call)."""
        if self.session is None:
            return
        info = {"tool": name, "via": "mcp"} | ({"raised": raised} if raised else {})
        try:
            await self.session.signal("tool_error", value=1.0, info=info)
        except Exception as e:  # noqa: BLE001 - a lost signal must not fail the tool call
            log.warning("recording a tool_error signal failed: %s", e)

    async def respond(self, method: str, target: str, headers: list[tuple[bytes, bytes]],
                      body: bytes, writer: asyncio.StreamWriter) -> None:
        """Answer one HTTP request (its body already read and bounded) on `writer`: the SDK's
        ASGI app driven directly, no web server in between."""
        path, _, query = target.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": query.encode(), "root_path": "",
                 "headers": [(k.lower(), v) for k, v in headers],
                 "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 4141)}
        answered, started = asyncio.Event(), False
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await answered.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started, status = True, int(message["status"])
                lines = [f"HTTP/1.1 {status} {_phrase(status)}".encode()]
                lines += [k + b": " + v for k, v in message.get("headers", [])
                          if k.lower() not in DROPPED]
                writer.write(b"\r\n".join([*lines, b"connection: close", b"", b""]))
            elif message["type"] == "http.response.body":
                writer.write(message.get("body", b""))
                await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT_S)
                if not message.get("more_body"):
                    answered.set()

        try:
            await self._manager.handle_request(scope, receive, send)
        except Exception as e:  # noqa: BLE001 - the agent gets an answer, the host a log line
            log.warning("MCP request failed: %s: %s", type(e).__name__, e)
            if not started:
                text = b'{"error": {"message": "the MCP server failed", "type": "envhub"}}'
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: "
                             b"application/json\r\ncontent-length: %d\r\nconnection: close"
                             b"\r\n\r\n%s" % (len(text), text))
        finally:
            answered.set()


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def client_configs(url: str) -> dict[str, str]:
    """Ready-made MCP client configs naming the server `envhub` at `url`, by file name:
    `mcp.json` for Claude Code (`claude --mcp-config FILE`) and the clients that read the same
    `mcpServers` shape; `codex.toml` to append to Codex's `$CODEX_HOME/config.toml`;
    `opencode.json` for opencode (`OPENCODE_CONFIG=FILE`)."""
    claude = {"mcpServers": {SERVER_NAME: {"type": "http", "url": url}}}
    opencode = {"$schema": "https://opencode.ai/config.json",
                "mcp": {SERVER_NAME: {"type": "remote", "url": url, "enabled": True}}}
    codex = f'[mcp_servers.{SERVER_NAME}]\nurl = "{url}"\n'
    return {"mcp.json": json.dumps(claude, indent=2) + "\n", "codex.toml": codex,
            "opencode.json": json.dumps(opencode, indent=2) + "\n"}


__all__ = ["SERVER_NAME", "ToolServer", "client_configs"]
