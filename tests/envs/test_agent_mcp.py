"""An environment's tools served over MCP to a command agent inside its sandbox (issue 29): the
agent's channel answers `POST /mcp` on the host from the rollout's own tools (envs/mcp/server.py),
dispatched as the built-in agent does, with the same per-rollout state, so what the agent
submits over MCP is what `verify` grades; the model's call and the tool's result are in the
pool because the agent sends them on to the model. Through /mcp the agent reaches only its own
rollout's tools: no other session, no gateway route, no body past the bound."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from envhub.envs.agents.channel import MCP_MAX_IN_FLIGHT, SessionChannel
from envhub.envs.agents.toolbox import Toolbox
from envhub.envs.loader import load_env
from envhub.envs.mcp.server import MAX_OUTPUT_CHARS, ToolServer, client_configs
from envhub.envs.sandbox.errors import FileTooLarge, SandboxFileError
from envhub.orchestrator.groups.memory_sandbox import MemorySandbox
from tests.e2e.agent_checks import only_rollout, pool_trajectory
from tests.envs.runtime_fixtures.gateway import ADMIN_KEY, FIXTURES, start_gateway
from tests.support import bundled_renderer, envhub, require_docker, require_tool, tool_call

AGENT = FIXTURES / "mcp_agent.py"


def arith_task(index: int = 0) -> Any:
    return load_env("arith").env.load_tasks()[index]


@pytest.mark.parametrize("kind,right", [
    pytest.param("local", True, marks=pytest.mark.bwrap),
    pytest.param("local", False, marks=pytest.mark.bwrap),
    pytest.param("docker", True, marks=pytest.mark.docker)])
def test_an_in_sandbox_agent_calls_the_environments_tools_over_mcp_and_is_graded_on_them(
        tmp_path: Path, kind: str, right: bool) -> None:
    """A stdlib agent inside a local sandbox lists arith's tools over MCP, offers them to a
    scripted model and runs the calls it makes (calculator, then submit) over MCP: the reward is
    the submitted answer's (arith keeps it in the runner's in-process store, which nothing but
    its `submit` tool can write), and both calls and the calculator's result are in the pool."""
    require_docker() if kind == "docker" else require_tool("bwrap")
    task = arith_task()
    answer = str(task.data["answer"]) if right else str(task.data["answer"] + 1)
    (tmp_path / "turns.json").write_text(json.dumps([
        tool_call("calculator", {"expression": "6 * 7"}),
        tool_call("submit", {"answer": answer})]))
    ran = envhub("run", "arith", "-t", task.id, "--agent", f"{AGENT.name} --probe",
                 "--agent-install", f"script:{AGENT}", "--sandbox", kind,
                 "--model", "scripted:turns.json", "-n", "1", "-k", "1", "--out", "out", "-q",
                 cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    record = only_rollout(tmp_path / "out")
    info = record["agent_info"]
    assert record["status"] == "done", record
    assert info["in_sandbox"] == kind and info["exit_code"] == 0, info
    lines = [json.loads(x) for x in info["stdout_tail"].splitlines()]
    assert {"tools": ["calculator", "submit"]} in lines
    calls = [(x["call"], x["result"]) for x in lines if "call" in x]
    assert calls == [("calculator", "42"), ("submit", f"submitted {answer}")], lines
    assert record["outcome"] == (1.0 if right else 0.0)
    assert record["resolved"] is right
    assert info["tool_calls"] == 2 and info["submitted"] and info["tool_errors"] == 0
    # the channel answered these itself or refused them: nothing but its own tools and its own
    # session's /v1 routes is reachable, and no body past the bound is read
    probes = next(x["probes"] for x in lines if "probes" in x)
    assert probes == {"get": 405, "sub": 403, "dots": 403, "admin": 403, "other": 403,
                      "big": 413}, probes
    assert info["gateway_requests"] == 2  # the two model calls; no MCP request went there
    traj = pool_trajectory(tmp_path / "out", record["session_id"])
    assert [[c.name for c in t.tool_calls] for t in traj.turns] == [["calculator"], ["submit"]]
    # the tool's result went to the model with the next call: recorded in that turn's prompt
    assert "42" in bundled_renderer().decode(traj.turns[1].prompt_delta_ids)


def _serve(gateway_url: str, key: str, folder: Path, server: ToolServer | None
           ) -> Any:
    async def start() -> SessionChannel:
        channel = await SessionChannel(folder, gateway_url, key).start()
        if server is not None:
            channel.serve_mcp(await server.start())
        return channel
    return start()


def _rpc(http: httpx.Client, method: str, params: dict | None = None, ident: int = 1,
         headers: dict | None = None) -> httpx.Response:
    return http.post("http://127.0.0.1:4141/mcp", headers={
        "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-06-18",
        **(headers or {})}, json={"jsonrpc": "2.0", "id": ident, "method": method,
                                  "params": params or {}})


def test_each_rollouts_channel_serves_its_own_tools_and_state_whatever_the_agent_sends(
        tmp_path: Path) -> None:
    """Two rollouts of arith, each with its channel: a submit over one lands in that rollout's
    store only, credentials in the request change nothing (the admin key, the other session's
    key), MCP requests never reach the gateway, and a channel without tools says so (404)."""
    gw, _ = start_gateway(tmp_path, ["unused"])
    loaded = load_env("arith")
    tasks = loaded.env.load_tasks()[:2]
    boxes = [MemorySandbox(), MemorySandbox()]
    states: list[dict[str, Any]] = [{}, {}]

    def body(paths: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        clients = [httpx.Client(transport=httpx.HTTPTransport(uds=p)) for p in paths]
        a, b, bare = clients
        out["init"] = _rpc(a, "initialize", {"protocolVersion": "2025-06-18",
                                             "capabilities": {},
                                             "clientInfo": {"name": "t", "version": "1"}})
        out["tools_b"] = _rpc(b, "tools/list").json()["result"]["tools"]
        out["submit_a"] = _rpc(a, "tools/call", {"name": "submit", "arguments": {
            "answer": str(tasks[0].data["answer"])}}, headers={
                "authorization": f"Bearer {ADMIN_KEY}", "x-api-key": "other-session-key"})
        out["bad_b"] = _rpc(b, "tools/call", {"name": "calculator",
                                              "arguments": {"expression": "import os"}})
        out["bare"] = _rpc(bare, "tools/list").status_code
        out["chunked"] = a.post("http://127.0.0.1:4141/mcp", headers={
            "accept": "application/json, text/event-stream", "content-type":
            "application/json", "mcp-protocol-version": "2025-06-18"},
            content=iter([b'{"jsonrpc": "2.0", "id": 9, ', b'"method": "tools/list"}']))
        for c in clients:
            c.close()
        return out

    async def main() -> tuple[dict[str, Any], list[SessionChannel], list[ToolServer]]:
        servers = [ToolServer(Toolbox(loaded.env, t, box), state)
                   for t, box, state in zip(tasks, boxes, states, strict=True)]
        channels = [await _serve(gw.url, f"key-{i}", tmp_path / f"ch{i}", s)
                    for i, s in enumerate([*servers, None])]
        try:
            out = await asyncio.to_thread(body, [str(c.socket_path) for c in channels])
        finally:
            for c in channels:
                await c.close()
        return out, channels, servers

    try:
        out, channels, servers = asyncio.run(main())
        verdicts = [asyncio.run(loaded.env.verify(t, box, None))  # type: ignore[arg-type]
                    for t, box in zip(tasks, boxes, strict=True)]
    finally:
        gw.close()
    assert out["init"].status_code == 200
    assert out["init"].json()["result"]["serverInfo"]["name"] == "envhub"
    assert [t["name"] for t in out["tools_b"]] == ["calculator", "submit"]
    assert out["submit_a"].json()["result"]["isError"] is False
    bad = out["bad_b"].json()["result"]
    assert bad["isError"] is True and "error" in bad["content"][0]["text"]
    assert out["bare"] == 404
    assert out["chunked"].status_code == 200, out["chunked"].text
    assert len(out["chunked"].json()["result"]["tools"]) == 2
    assert verdicts[0].resolved and not verdicts[1].resolved
    assert verdicts[1].info["reason"] == "no answer submitted"
    assert (servers[0].submitted, servers[1].submitted) == (True, False)
    assert (servers[0].calls, servers[1].calls, servers[1].errors) == (1, 1, 1)
    assert [c.requests for c in channels] == [0, 0, 0]  # nothing was forwarded to the gateway
    assert [c.mcp_requests for c in channels] == [3, 2, 0]
    assert all(not (tmp_path / f"ch{i}").exists() for i in range(3))


FLOOD_ENV = """
import json

from envhub.envs.environment import ToolResult, Verdict
from envhub.envs.loader import rows_to_tasks, task_rows

NONE = {"type": "object", "properties": {}}


class Environment:
    def __init__(self, folder, manifest):
        self.folder, self.manifest = folder, manifest

    def load_tasks(self):
        return rows_to_tasks(task_rows(self.folder, self.manifest.tasks))

    async def setup(self, task, ctx):
        return await ctx.open_sandbox(self.manifest.sandbox)

    def tools(self, task):
        return ["flood", "read"]

    def tool_schemas(self, task):
        if task.data.get("broken"):
            raise RuntimeError("the tool schemas crashed")
        read = {"type": "object", "properties": {"path": {"type": "string"}}}
        return [{"type": "function", "function": {"name": "flood", "parameters": NONE}},
                {"type": "function", "function": {"name": "read", "parameters": read}}]

    async def call_tool(self, task, name, arguments, sandbox, state):
        if name == "flood":
            return ToolResult("x" * (1 << 20))
        data = await sandbox.read_file(json.loads(arguments)["path"])
        return ToolResult(data.decode(errors="replace"))

    async def solve(self, task, sandbox, ctx):
        pass

    async def verify(self, task, sandbox, ctx):
        return Verdict(0.0, False, {})
"""
FLOOD_MANIFEST = """
name = "flood"
version = "0.1.0"
entrypoint = "env:Environment"

[tasks]
path = "tasks.jsonl"

[sandbox]
kind = "local"

[rewards]
outcome = 1.0
"""


def flood_env(root: Path, code: str = FLOOD_ENV) -> Any:
    """A tiny environment of its own tools (ToolProvider): `flood` answers 1 MiB of text,
    `read` a file of the sandbox (raising as the sandbox does); task `broken`'s tool schemas
    crash."""
    folder = root / "flood"
    folder.mkdir()
    (folder / "envhub.toml").write_text(FLOOD_MANIFEST)
    (folder / "env.py").write_text(code)
    (folder / "tasks.jsonl").write_text(
        json.dumps({"id": "t1", "instruction": "Read."}) + "\n"
        + json.dumps({"id": "broken", "instruction": "Read.", "broken": True}) + "\n")
    return load_env(str(folder))


def test_tool_output_is_bounded_and_an_unreachable_sandboxs_failure_is_kept(
        tmp_path: Path) -> None:
    """A tool acting on a sandbox the agent cannot reach (an in-process store) that raises is
    the environment's failure, whatever the agent did: kept for the runner."""
    loaded = flood_env(tmp_path)
    task = loaded.env.load_tasks()[0]

    async def main() -> tuple[tuple[str, bool], tuple[str, bool], Any]:
        server = ToolServer(Toolbox(loaded.env, task, MemorySandbox()), {})
        return (await server.call("flood", {}), await server.call("read", {"path": "x"}),
                await server.failure_after_agent())

    (text, is_error), (failed, failed_error), failure = asyncio.run(main())
    assert not is_error and MAX_OUTPUT_CHARS <= len(text) < MAX_OUTPUT_CHARS + 200
    assert "characters cut" in text
    assert failed_error and "SandboxFileError" in failed
    assert isinstance(failure, SandboxFileError)  # BoxedCommandAgent raises it after the agent


def test_a_tool_name_too_long_for_mcp_clients_is_refused_before_the_agent_starts(
        tmp_path: Path) -> None:
    """Claude Code offers a tool as mcp__envhub__<name>: past 64 characters the model could
    not be offered it, so the environment is refused with the fix (env_failure, not a 0)."""
    from envhub.envs.environment import EnvFailure

    long = "f" * 60
    loaded = flood_env(tmp_path, FLOOD_ENV.replace('"name": "flood"', f'"name": "{long}"')
                       .replace('return ["flood", "read"]', f'return ["{long}", "read"]'))
    task = loaded.env.load_tasks()[0]
    server = ToolServer(Toolbox(loaded.env, task, MemorySandbox()), {})
    with pytest.raises(EnvFailure, match=f"'{long}' is too long.*shorten it"):
        asyncio.run(server.start())


@pytest.mark.bwrap
def test_a_tool_failure_in_the_agents_own_healthy_sandbox_is_graded_not_dropped(
        tmp_path: Path) -> None:
    """The agent shares the tools' sandbox: a file past the read limit it made for `read`
    makes the tool raise (FileTooLarge), which must not turn its rollout into a dropped
    sample. It is a tool error; only a sandbox that also fails the probe after the agent is
    an env failure."""
    require_tool("bwrap")
    from envhub.envs.sandbox.local import LocalSandbox

    loaded = flood_env(tmp_path)
    task = loaded.env.load_tasks()[0]

    async def main() -> tuple[tuple[str, bool], Any, Any, int]:
        box = await LocalSandbox.create(loaded.manifest.sandbox)
        server = ToolServer(Toolbox(loaded.env, task, box), {}, shared=True)
        try:
            await box.exec("truncate -s 100M big.bin")  # over MAX_READ_BYTES, no disk used
            answer = await server.call("read", {"path": "big.bin"})
            healthy = await server.failure_after_agent()
        finally:
            await box.close()
        return answer, healthy, await server.failure_after_agent(), server.errors

    (text, is_error), healthy, broken, errors = asyncio.run(main())
    assert is_error and "FileTooLarge" in text and errors == 1
    assert healthy is None  # the sandbox answers the probe: graded as a tool error
    assert isinstance(broken, FileTooLarge)  # a sandbox that cannot: the infrastructure's


async def _exchange(path: Path, data: list[bytes], pause: float = 0.0) -> bytes:
    """Send `data` (pausing between pieces) on the channel's socket; what came back."""

    def talk() -> bytes:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(str(path))
            with contextlib.suppress(ConnectionError):  # answered (and closed) before the end
                for i, piece in enumerate(data):
                    time.sleep(pause if i else 0)
                    s.sendall(piece)
            answer = b""
            with contextlib.suppress(ConnectionError):
                while chunk := s.recv(1 << 16):
                    answer += chunk
            return answer

    return await asyncio.to_thread(talk)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer else 0


HEAD = (b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:4141\r\ncontent-type: application/json\r\n"
        b"accept: application/json, text/event-stream\r\n")


def test_mcp_requests_are_bounded_in_size_time_and_number(tmp_path: Path) -> None:
    """What one agent can make the host hold through /mcp: bodies past MCP_MAX_BODY_BYTES
    (chunked too) are refused (413), a body that trickles is cut off (408), a malformed chunk
    is a 400, and past MCP_MAX_IN_FLIGHT requests at once the next is refused (429)."""
    loaded = flood_env(tmp_path)
    task = loaded.env.load_tasks()[0]
    chunked = HEAD + b"transfer-encoding: chunked\r\n\r\n"
    piece = b"%x\r\n%s\r\n" % (64 << 10, b"x" * (64 << 10))

    async def main() -> dict[str, Any]:
        channel = await SessionChannel(tmp_path / "ch", "http://127.0.0.1:9", "k",
                                       head_timeout_s=1.5).start()
        channel.serve_mcp(await ToolServer(Toolbox(loaded.env, task, MemorySandbox()),
                                           {}).start())
        path = channel.socket_path
        out: dict[str, Any] = {}
        try:
            out["too_big"] = _status(await _exchange(path, [chunked] + [piece] * 5))
            out["bad_chunk"] = _status(await _exchange(path, [chunked + b"zz\r\nxx\r\n"]))
            out["slow"] = _status(await _exchange(path, [HEAD + b"content-length: 10\r\n\r\n",
                                                         b"{"], pause=2.0))
            # MCP_MAX_IN_FLIGHT requests whose bodies have not arrived yet hold every place (on
            # a channel whose read timer outlasts a loaded machine's scheduling of the rest)
            patient = await SessionChannel(tmp_path / "ch2", "http://127.0.0.1:9", "k",
                                           head_timeout_s=8).start()
            patient.serve_mcp(await ToolServer(Toolbox(loaded.env, task, MemorySandbox()),
                                               {}).start())
            try:
                held = [asyncio.create_task(_exchange(patient.socket_path,
                                                      [HEAD + b"content-length: 10\r\n\r\n"]))
                        for _ in range(MCP_MAX_IN_FLIGHT)]
                deadline = time.monotonic() + 30
                while patient.mcp_in_flight < MCP_MAX_IN_FLIGHT:
                    assert time.monotonic() < deadline and not any(t.done() for t in held)
                    await asyncio.sleep(0.01)
                out["crowded"] = _status(await _exchange(
                    patient.socket_path, [HEAD + b"content-length: 2\r\n\r\n{}"]))
                out["held"] = [_status(a) for a in await asyncio.gather(*held)]
            finally:
                await patient.close()
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
            out["ok"] = await _exchange(path, [HEAD + b"mcp-protocol-version: 2025-06-18\r\n"
                                               b"content-length: %d\r\n\r\n%s" % (len(body), body)])
        finally:
            await channel.close()
            await channel.close()  # safe twice
        return out

    out = asyncio.run(main())
    assert (out["too_big"], out["bad_chunk"], out["slow"]) == (413, 400, 408), out
    assert out["crowded"] == 429 and out["held"] == [408] * MCP_MAX_IN_FLIGHT, out
    assert _status(out["ok"]) == 200 and b'"flood"' in out["ok"], out["ok"][:500]


@pytest.mark.bwrap
def test_tools_that_cannot_be_served_answer_503_and_an_agent_that_asked_is_dropped(
        tmp_path: Path) -> None:
    """The environment's tool schemas crash: the command agent still runs, /mcp tells it why
    (503), and because it asked for its tools the rollout is env_failure, never a silent 0."""
    require_tool("bwrap")
    flood_env(tmp_path)
    (tmp_path / "turns.json").write_text(json.dumps(["Done."]))
    ran = envhub("run", str(tmp_path / "flood"), "-t", "broken", "--agent", AGENT.name,
                 "--agent-install", f"script:{AGENT}", "--sandbox", "local",
                 "--model", "scripted:turns.json", "-n", "1", "-k", "1", "--out", "out", "-q",
                 cwd=tmp_path)
    record = only_rollout(tmp_path / "out")
    assert record["status"] == "env_failure", (record, ran.stderr[-2000:])
    assert "could not be served" in record["reason"], record["reason"]
    assert "the tool schemas crashed" in record["reason"], record["reason"]


def test_client_configs_name_the_server_envhub_at_the_url() -> None:
    url = "http://127.0.0.1:4141/mcp"
    configs = client_configs(url)
    assert json.loads(configs["mcp.json"]) == {
        "mcpServers": {"envhub": {"type": "http", "url": url}}}
    assert json.loads(configs["opencode.json"])["mcp"]["envhub"] == {
        "type": "remote", "url": url, "enabled": True}
    import tomllib

    assert tomllib.loads(configs["codex.toml"]) == {"mcp_servers": {"envhub": {"url": url}}}
