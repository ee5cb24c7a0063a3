"""An environment's own MCP servers (`[mcp.NAME]`, envs/mcp/client.py) used by the built-in agent:
the server runs over stdio inside the rollout's local (bubblewrap) sandbox, its tools act on
the agent's workspace, and the model's calls and their results are in the recorded turns.

The test server is a stdlib-only JSON-RPC MCP server (a few dozen lines): the sandbox's python3
is the host's /usr/bin/python3, which does not see the project's .venv, so it cannot import the
`mcp` SDK. The client side is the SDK's (`stdio_client`, `ClientSession`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

import pytest

from envhub.envs.manifest import ManifestError, parse_manifest
from envhub.orchestrator.groups import EnvChoice, RunConfig, run
from tests.e2e.agent_checks import only_rollout, pool_trajectory
from tests.support import bundled_renderer, require_docker, require_tool, tool_call

SERVER = r'''
import json, os, socket, sys

if os.environ.get("MODE") == "broken":
    sys.exit("cannot start: broken on purpose")
NONE = {"type": "object", "properties": {}}
TOOLS = [
    {"name": "where", "description": "where this server runs, and the task's secret",
     "inputSchema": NONE},
    {"name": "write", "description": "write text to a file of the workspace",
     "inputSchema": {"type": "object", "required": ["path", "text"],
                     "properties": {"path": {"type": "string"}, "text": {"type": "string"}}}},
    {"name": "crash", "description": "exit at once", "inputSchema": NONE},
    {"name": "nap", "description": "sleep s seconds",
     "inputSchema": {"type": "object", "properties": {"s": {"type": "number"}}}},
    {"name": "big", "description": "n characters of output",
     "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    {"name": "shaped", "description": "an answer that breaks its own outputSchema",
     "inputSchema": NONE, "outputSchema": {"type": "object", "required": ["n"],
                                           "properties": {"n": {"type": "integer"}}}},
    {"name": "spawn", "description": "start a child process that must outlive the call",
     "inputSchema": NONE},
    {"name": "child", "description": "whether the spawned child still runs", "inputSchema": NONE},
]
if os.environ.get("MODE") == "dotted":
    TOOLS.append({"name": "fs.read", "description": "not a function name", "inputSchema": NONE})
CHILD = []

def call(name, args):
    if name == "where":
        secret = open("secret.txt").read().strip() if os.path.exists("secret.txt") else "-"
        return f"host={socket.gethostname()} cwd={os.getcwd()} secret={secret}"
    if name == "write":
        with open(args["path"], "w") as f:
            f.write(args["text"])
        return f"wrote {len(args['text'])} characters to {args['path']}"
    if name == "crash":
        os._exit(3)
    if name == "big":
        return "x" * args["n"]
    if name == "spawn":
        import subprocess
        CHILD.append(subprocess.Popen(["sleep", "300"]))
        return f"child {CHILD[-1].pid}"
    if name == "child":
        return "child alive" if CHILD and CHILD[-1].poll() is None else "child gone"
    if name == "nap":
        import time
        time.sleep(args["s"])
        return "rested"
    raise KeyError(name)

def answer(method, params):
    if method == "initialize":
        return {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                "serverInfo": {"name": "notes", "version": "1.0"}}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        if params["name"] == "shaped":
            return {"content": [{"type": "text", "text": "n is a word"}],
                    "structuredContent": {"n": "a word"}}
        try:
            text = call(params["name"], params.get("arguments") or {})
        except (KeyError, OSError) as e:
            return {"content": [{"type": "text", "text": f"failed: {e!r}"}], "isError": True}
        return {"content": [{"type": "text", "text": text}]}
    if method == "ping":
        return {}
    return None

for line in sys.stdin:
    request = json.loads(line)
    if "id" not in request:
        continue  # a notification
    result = answer(request["method"], request.get("params") or {})
    reply = {"jsonrpc": "2.0", "id": request["id"]}
    if result is None:
        reply["error"] = {"code": -32601, "message": "method not found"}
    else:
        reply["result"] = result
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
'''

ENV = '''
from envhub.envs.environment import Verdict
from envhub.envs.loader import rows_to_tasks, task_rows


class Environment:
    def __init__(self, folder, manifest):
        self.folder, self.manifest = folder, manifest

    def load_tasks(self):
        return rows_to_tasks(task_rows(self.folder, self.manifest.tasks))

    async def setup(self, task, ctx):
        sandbox = await ctx.open_sandbox(self.manifest.sandbox)
        await sandbox.write_file("secret.txt", task.data["secret"].encode())
        return sandbox

    def tools(self, task):
        return list(self.manifest.tools)

    async def solve(self, task, sandbox, ctx):
        await sandbox.write_file("answer.txt", task.data["secret"].encode())

    async def verify(self, task, sandbox, ctx):
        try:
            answer = (await sandbox.read_file("answer.txt", limit=1000)).decode()
        except Exception:
            answer = ""
        ok = answer.strip() == task.data["secret"]
        return Verdict(1.0 if ok else 0.0, ok, {"answer": answer[:100]})
'''

MANIFEST = '''
name = "notes"
version = "0.1.0"
entrypoint = "env:Environment"
tools = ["bash", "submit"]

[tasks]
path = "tasks.jsonl"

[sandbox]
kind = "local"

[rewards]
outcome = 1.0

[agent]
max_turns = 8

[mcp.notes]
command = ["python3", "/run/envhub-mcp/notes/server.py"]
files = ["server.py"]
tools = ["where", "write", "crash", "big", "nap"]
startup_timeout_s = 20
call_timeout_s = 20
'''
SECRET = "owl-5281"


def make_env(root: Path, manifest: str = MANIFEST) -> Path:
    folder = root / "notes"
    folder.mkdir()
    (folder / "envhub.toml").write_text(manifest)
    (folder / "env.py").write_text(ENV)
    (folder / "server.py").write_text(SERVER)
    (folder / "tasks.jsonl").write_text(json.dumps(
        {"id": "t1", "instruction": "Write the secret to answer.txt.", "secret": SECRET}) + "\n")
    return folder


def run_scripted(tmp_path: Path, folder: Path, script: list[str], kind: str = "local") -> dict:
    (tmp_path / "script.json").write_text(json.dumps(script))
    out = tmp_path / "out"
    asyncio.run(run(RunConfig(envs=[EnvChoice.parse(str(folder))], agent="tool",
                              model=f"scripted:{tmp_path / 'script.json'}", sandbox=kind,
                              n=1, k=1, out=out), progress=False))
    return only_rollout(out)


def prompts(tmp_path: Path, record: dict) -> list[str]:
    """Each recorded turn's prompt delta as text, in order."""
    traj = pool_trajectory(tmp_path / "out", record["session_id"])
    renderer = bundled_renderer()
    return [renderer.decode(t.prompt_delta_ids) for t in sorted(traj.turns, key=lambda t: t.seq)]


@pytest.mark.bwrap
@pytest.mark.parametrize("answer", [SECRET, "wrong"])
def test_the_agent_uses_the_environments_mcp_server_inside_its_sandbox(tmp_path, answer):
    require_tool("bwrap")
    record = run_scripted(tmp_path, make_env(tmp_path), [
        tool_call("notes__where", {}),
        tool_call("notes__write", {"path": "answer.txt", "text": answer}),
        tool_call("submit", {}),
    ])
    assert record["status"] == "done", record
    # the reward depends on what the MCP tool wrote into the agent's workspace
    assert record["outcome"] == (1.0 if answer == SECRET else 0.0), record["verdict"]
    assert record["verdict"]["answer"] == answer
    seen = prompts(tmp_path, record)
    assert len(seen) == 3
    # offered to the model: the first prompt lists the server's tools under their offered names
    assert "notes__where" in seen[0] and "notes__write" in seen[0]
    # the server ran inside the sandbox (bubblewrap's host name, the sandbox's workdir) and read
    # the task's file there; its answer is in the next recorded prompt
    assert f"host=sandbox cwd=/workspace secret={SECRET}" in seen[1]
    assert f"wrote {len(answer)} characters to answer.txt" in seen[2]
    # the model's calls are recorded as parsed tool calls of their turns
    turns = sorted(pool_trajectory(tmp_path / "out", record["session_id"]).turns,
                   key=lambda t: t.seq)
    assert [[c.name for c in t.tool_calls] for t in turns] == [
        ["notes__where"], ["notes__write"], ["submit"]]


@pytest.mark.docker
def test_in_docker_the_server_outlives_each_exec_and_dies_by_the_agents_hand(tmp_path):
    """docker: the sweep after every exec spares the server; the agent, in the same container,
    can kill it, and what follows is graded, not dropped."""
    require_docker()
    record = run_scripted(tmp_path, make_env(tmp_path), [
        tool_call("notes__where", {}),
        tool_call("bash", {"command": "sleep 0.2; echo swept"}),
        tool_call("notes__write", {"path": "answer.txt", "text": SECRET}),
        tool_call("bash", {"command": "pkill -9 -f server.py"}),
        tool_call("notes__where", {}),
        tool_call("submit", {}),
    ], kind="docker")
    assert record["status"] == "done" and record["outcome"] == 1.0, record
    seen = prompts(tmp_path, record)
    assert f"cwd=/workspace secret={SECRET}" in seen[1]
    assert "wrote 8 characters to answer.txt" in seen[3]  # still running after the sweep
    assert "no longer running" in seen[5]


@pytest.mark.docker
def test_in_docker_the_children_a_server_forks_outlive_each_exec(tmp_path):
    """A server that forks (npx -> node, uvx -> python) keeps its children across the sweep
    after each of the agent's execs: the server's whole session is spared, until
    end_processes."""
    require_docker()
    record = run_scripted(tmp_path, make_env(tmp_path, MANIFEST.replace(
        '"nap"]', '"nap", "spawn", "child"]')), [
        tool_call("notes__spawn", {}),
        tool_call("bash", {"command": "sleep 0.2; echo swept"}),
        tool_call("notes__child", {}),
        tool_call("submit", {}),
    ], kind="docker")
    assert record["status"] == "done", record
    seen = prompts(tmp_path, record)
    assert "child " in seen[1] and "swept" in seen[2]
    assert "child alive" in seen[3], seen[3][-300:]


@pytest.mark.bwrap
@pytest.mark.slow
def test_the_bundled_model_calls_an_mcp_tool_and_reads_its_result(tmp_path):
    """The real loop on the bundled model: every reply constrained to a tool call
    (`tool:required`) and the server's tools the only ones offered."""
    require_tool("bwrap")
    manifest = (MANIFEST.replace('tools = ["bash", "submit"]', "tools = []")
                .replace('"crash", "big", "nap"]', "]")
                .replace("max_turns = 8", "max_turns = 2\nmax_tokens_per_turn = 64"))
    folder = make_env(tmp_path, manifest)
    out = tmp_path / "out"
    asyncio.run(run(RunConfig(envs=[EnvChoice.parse(str(folder))], agent="tool:required",
                              sandbox="local", n=1, k=1, out=out), progress=False))
    record = only_rollout(out)
    assert record["status"] == "done" and record["turns"] == 2, record
    traj = pool_trajectory(out, record["session_id"])
    first = min(traj.turns, key=lambda t: t.seq)
    assert [c.name for c in first.tool_calls][:1] in (["notes__where"], ["notes__write"])
    # what the server answered (in the sandbox) is the next recorded prompt
    assert "<tool_response>" in prompts(tmp_path, record)[1]


@pytest.mark.bwrap
def test_a_server_that_dies_mid_rollout_is_a_tool_error_not_an_env_failure(tmp_path):
    require_tool("bwrap")
    record = run_scripted(tmp_path, make_env(tmp_path), [
        tool_call("notes__crash", {}),
        tool_call("notes__where", {}),
        tool_call("submit", {}),
    ])
    # the agent shares the sandbox with the server: its death after the agent acted is graded
    assert record["status"] == "done" and record["outcome"] == 0.0, record
    seen = prompts(tmp_path, record)
    assert "no longer running" in seen[1] and "no longer running" in seen[2]
    assert any(e.get("info", {}).get("tool") == "notes__crash" for e in record["rewards"]
               if e.get("kind") == "process"), record["rewards"]


@pytest.mark.bwrap
def test_the_agent_can_neither_kill_nor_read_the_server_and_its_output_is_bounded(tmp_path):
    require_tool("bwrap")
    record = run_scripted(tmp_path, make_env(tmp_path), [
        # the agent's commands run in pid namespaces of their own: the server is out of reach,
        # and the server's code (`files`) is bound into the server's sandbox only
        tool_call("bash", {"command": "pkill -9 python3; kill -9 -1"}),
        tool_call("bash", {"command": "cat /run/envhub-mcp/notes/server.py | head -c 50"}),
        tool_call("notes__where", {}),
        tool_call("notes__big", {"n": 30_000}),  # cut in the middle for the model
        tool_call("notes__big", {"n": 9 << 20}),  # over the transport's cap: the server is cut off
        tool_call("notes__where", {}),
        tool_call("submit", {}),
    ])
    assert record["status"] == "done", record
    seen = prompts(tmp_path, record)
    assert "No such file or directory" in seen[2] and "import json" not in seen[2], seen[2]
    assert f"host=sandbox cwd=/workspace secret={SECRET}" in seen[3]
    assert "characters cut from the middle" in seen[4] and len(seen[4]) < 12_000
    assert "no longer running (it sent a message over" in seen[5], seen[5][-500:]
    assert "no longer running" in seen[6]


@pytest.mark.bwrap
def test_slow_calls_time_out_and_a_cancelled_rollout_leaves_no_server(tmp_path):
    require_tool("bwrap")
    from envhub.envs.mcp.client import McpTools
    from envhub.envs.sandbox.local import LocalSandbox

    mark = uuid.uuid4().hex
    folder = make_env(tmp_path, MANIFEST.replace("call_timeout_s = 20", "call_timeout_s = 1")
                      + f'env = {{ MARK = "{mark}" }}\n')
    manifest = parse_manifest((folder / "envhub.toml").read_text())

    async def scenario() -> None:
        sandbox = await LocalSandbox.create(manifest.sandbox)
        tools = McpTools(manifest, sandbox, folder)
        try:
            await tools.start()
            assert running(mark)
            slow = await tools.call("notes__nap", '{"s": 30}')
            assert slow.is_error and "did not answer within 1s" in slow.content, slow.content
            # the rollout is cancelled (the runner's time limit) in the middle of a call
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(tools.call("notes__nap", '{"s": 30}'), 0.5)
        finally:
            await tools.aclose()
            await sandbox.close()
        assert not running(mark)

    asyncio.run(scenario())


@pytest.mark.bwrap
def test_an_answer_that_breaks_its_output_schema_is_an_error_result_and_the_server_goes_on(
        tmp_path):
    """The SDK refuses a result whose structured content breaks the tool's outputSchema
    (RuntimeError): that answer is shaped by the agent's inputs, so it is the call's error
    result, not a crash of the agent, and the server keeps serving."""
    require_tool("bwrap")
    from envhub.envs.mcp.client import McpTools
    from envhub.envs.sandbox.local import LocalSandbox

    folder = make_env(tmp_path, MANIFEST.replace('"nap"]', '"nap", "shaped"]'))
    manifest = parse_manifest((folder / "envhub.toml").read_text())

    async def scenario() -> tuple:
        sandbox = await LocalSandbox.create(manifest.sandbox)
        tools = McpTools(manifest, sandbox, folder)
        try:
            # started by a task that is over before the calls: the sessions are owned by a
            # task of their own, not by whichever task started them
            await asyncio.create_task(tools.start())
            return (await tools.call("notes__shaped", "{}"),
                    await tools.call("notes__where", "{}"))
        finally:
            await tools.aclose()
            await sandbox.close()

    shaped, after = asyncio.run(scenario())
    assert shaped.is_error and "answer was refused" in shaped.content, shaped.content
    assert not after.is_error and "host=sandbox" in after.content, after.content


@pytest.mark.bwrap
def test_a_listed_tool_that_is_no_function_name_is_an_env_failure_naming_the_fix(tmp_path):
    require_tool("bwrap")
    from envhub.envs.environment import EnvFailure
    from envhub.envs.mcp.client import McpTools
    from envhub.envs.sandbox.local import LocalSandbox

    folder = make_env(tmp_path, MANIFEST.replace(
        'tools = ["where", "write", "crash", "big", "nap"]\n', "")
        + 'env = { MODE = "dotted" }\n')
    manifest = parse_manifest((folder / "envhub.toml").read_text())

    async def scenario() -> None:
        sandbox = await LocalSandbox.create(manifest.sandbox)
        tools = McpTools(manifest, sandbox, folder)
        try:
            await tools.start()
        finally:
            await tools.aclose()
            await sandbox.close()

    with pytest.raises(EnvFailure, match=r"'fs\.read'.*`tools`.*`prefix`"):
        asyncio.run(scenario())


def running(mark: str) -> bool:
    return subprocess.run(["pgrep", "-f", mark], capture_output=True).returncode == 0


@pytest.mark.bwrap
def test_a_server_that_cannot_start_is_an_env_failure_with_its_stderr(tmp_path):
    require_tool("bwrap")
    folder = make_env(tmp_path, MANIFEST + 'env = { MODE = "broken" }\n')
    record = run_scripted(tmp_path, folder, [tool_call("submit", {})])
    assert record["status"] == "env_failure", record
    assert "[mcp.notes] did not start" in record["reason"], record["reason"]
    assert "broken on purpose" in record["reason"], record["reason"]


@pytest.mark.bwrap
def test_a_declared_tool_the_server_lacks_is_an_env_failure(tmp_path):
    require_tool("bwrap")
    folder = make_env(tmp_path, MANIFEST.replace('"nap"]', '"nap", "fly"]'))
    record = run_scripted(tmp_path, folder, [tool_call("submit", {})])
    assert record["status"] == "env_failure", record
    assert "mcp.notes.tools" in record["reason"] and "'fly'" in record["reason"], record


@pytest.mark.parametrize("table, field, words", [
    ('[mcp.my_server]\ncommand = ["x"]', "mcp", "lowercase letters, digits or '-'"),
    ("[mcp.s]\ncommand = []", "mcp.s.command", "argv"),
    ('[mcp.s]\ncommand = ["x"]\nfiles = ["../secret"]', "mcp.s.files", "inside the package"),
    ('[mcp.s]\ncommand = ["x"]\ntimeout = 3', "mcp.s.timeout", "unknown field"),
    ('[mcp.s]\ncommand = ["x"]\ncall_timeout_s = "9"', "mcp.s.call_timeout_s", "a number"),
    ('[mcp.s]\ncommand = ["x"]\ntools = ["' + "t" * 70 + '"]', "mcp", "at most 64"),
    ('[mcp.s]\ncommand = "python3 server.py"', "mcp.s.command", "a list"),
    ('[sandbox]\nkind = "none"\n[mcp.s]\ncommand = ["x"]', "(root)", "set [sandbox] kind"),
])
def test_bad_mcp_tables_name_the_field_and_the_fix(table, field, words):
    base = 'name = "e"\nversion = "0.1.0"\nentrypoint = "env:E"\n'
    with pytest.raises(ManifestError) as e:
        parse_manifest(base + table)
    assert f"field '{field}'" in str(e.value) and words in str(e.value), str(e.value)


def test_a_sandbox_without_long_lived_processes_is_refused_with_the_fix(tmp_path):
    from envhub.envs.environment import EnvFailure
    from envhub.envs.mcp.client import McpTools
    from envhub.orchestrator.groups.memory_sandbox import MemorySandbox

    folder = make_env(tmp_path)
    tools = McpTools(parse_manifest((folder / "envhub.toml").read_text()), MemorySandbox(), folder)
    with pytest.raises(EnvFailure, match="run with --sandbox local or docker"):
        asyncio.run(tools.start())


def test_tool_results_become_text_and_bad_arguments_an_error():
    from mcp.types import (
        BlobResourceContents,
        CallToolResult,
        EmbeddedResource,
        ImageContent,
        TextContent,
        TextResourceContents,
    )

    from envhub.envs.mcp.client import parse_arguments, result_text

    result = CallToolResult(content=[
        TextContent(type="text", text="hello"),
        ImageContent(type="image", data="aGVsbG8h", mime_type="image/png"),
        EmbeddedResource(type="resource", resource=TextResourceContents(
            uri="file:///a.txt", text="inside")),
        EmbeddedResource(type="resource", resource=BlobResourceContents(
            uri="file:///b.bin", blob="AAAA", mime_type="application/octet-stream")),
    ])
    assert result_text(result).splitlines() == [
        "hello", "[image (image/png, 6 bytes) not shown: this agent reads text only]", "inside",
        "[resource file:///b.bin (application/octet-stream): binary, not shown]"]
    assert result_text(CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'
    assert parse_arguments("t", "") == {} and parse_arguments("t", '{"a": 1}') == {"a": 1}
    assert parse_arguments("t", "[1]").is_error and parse_arguments("t", "{").is_error


def test_a_missing_server_file_is_refused_when_the_package_loads(tmp_path):
    from envhub.envs.loader import load_env

    folder = make_env(tmp_path)
    (folder / "server.py").unlink()
    with pytest.raises(ManifestError, match=r"field 'mcp.notes.files': 'server.py' is not in"):
        load_env(str(folder))


def test_offered_names_follow_the_prefix():
    m = parse_manifest('name = "e"\nversion = "0.1.0"\nentrypoint = "env:E"\n'
                       '[mcp.fs]\ncommand = ["x"]\n[mcp.raw]\ncommand = ["y"]\nprefix = ""\n')
    assert m.mcp_tool_name("fs", "read") == "fs__read" and m.mcp_tool_name("raw", "read") == "read"
