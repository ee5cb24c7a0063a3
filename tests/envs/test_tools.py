"""Agent tools on real sandboxes: every tool's happy path and error path.

The full matrix runs on the local (bubblewrap) sandbox; a docker pass covers the tools whose
implementation differs per backend (file access, exec).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import open_sandbox, reap
from envhub.envs.tools import TOOL_NAMES, ToolState, call_tool, cut_middle, tool_schemas
from tests.support import require_docker, require_tool


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def local_box():
    require_tool("bwrap")
    box = run(open_sandbox("local", SandboxSpec(exec_timeout_s=20), run_id="t-tools"))
    yield box
    run(box.close())


def call(box, name: str, args, state: ToolState | None = None, **kw):
    payload = args if isinstance(args, str) else json.dumps(args)
    return run(call_tool(name, payload, box, state or ToolState(), **kw))


def test_schemas_are_openai_function_tools() -> None:
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOL_NAMES)
    for schema in schemas:
        assert schema["type"] == "function"
        params = schema["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
    with pytest.raises(ValueError, match="unknown tool"):
        tool_schemas(["bash", "teleport"])


def test_cut_middle_keeps_head_and_tail() -> None:
    text = "a" * 6000 + "b" * 6000
    cut = cut_middle(text)
    assert cut.startswith("a" * 5000) and cut.endswith("b" * 5000)
    assert "2000 characters cut" in cut
    assert cut_middle("short") == "short"


@pytest.mark.bwrap
def test_bash_tool(local_box) -> None:
    ok = call(local_box, "bash", {"command": "echo hi; echo warn >&2"})
    assert not ok.is_error and ok.content == "hi\nwarn\n" and ok.exit_code == 0
    failed = call(local_box, "bash", {"command": "exit 3"})
    assert not failed.is_error and "[exit code 3]" in failed.content
    long = call(local_box, "bash", {"command": "python3 -c \"print('x' * 20000)\""})
    assert "characters cut" in long.content and len(long.content) < 10300
    slow = call(local_box, "bash", {"command": "sleep 30", "timeout": 1})
    assert slow.is_error and "timed out" in slow.content


@pytest.mark.bwrap
@pytest.mark.parametrize("name,args,needle", [
    ("bash", "{not json", "not valid JSON"),
    ("bash", "[1, 2]", "must be a JSON object"),
    ("bash", {}, "command"),
    ("bash", {"command": "ls", "rm_rf": True}, "rm_rf"),
    ("bash", {"command": "ls", "timeout": -1}, "timeout"),
    ("teleport", {}, "unknown tool"),
    ("str_replace_editor", {"command": "explode", "path": "a"}, "command"),
    ("search", {"pattern": ""}, "pattern"),
])
def test_model_mistakes_are_error_results(local_box, name, args, needle) -> None:
    state = ToolState()
    result = call(local_box, name, args, state)
    assert result.is_error and needle in result.content
    assert state.errors == 1 and state.calls == 1


@pytest.mark.bwrap
def test_editor_create_view_replace_insert_undo(local_box) -> None:
    state = ToolState()
    ed = "str_replace_editor"
    made = call(local_box, ed, {"command": "create", "path": "m.py",
                                "file_text": "a = 1\nb = 2\nc = 3"}, state)
    assert not made.is_error
    again = call(local_box, ed, {"command": "create", "path": "m.py", "file_text": ""}, state)
    assert again.is_error and "already exists" in again.content
    view = call(local_box, ed, {"command": "view", "path": "m.py"}, state)
    assert view.content == "     1\ta = 1\n     2\tb = 2\n     3\tc = 3"
    part = call(local_box, ed, {"command": "view", "path": "m.py", "view_range": [2, -1]}, state)
    assert part.content == "     2\tb = 2\n     3\tc = 3"
    bad_range = call(local_box, ed, {"command": "view", "path": "m.py", "view_range": [5, 9]},
                     state)
    assert bad_range.is_error and "outside" in bad_range.content
    rep = call(local_box, ed, {"command": "str_replace", "path": "m.py", "old_str": "b = 2",
                               "new_str": "b = 20"}, state)
    assert not rep.is_error and "b = 20" in rep.content
    ins = call(local_box, ed, {"command": "insert", "path": "m.py", "insert_line": 0,
                               "new_str": "# top"}, state)
    assert not ins.is_error
    assert run(local_box.read_file("m.py")) == b"# top\na = 1\nb = 20\nc = 3"
    call(local_box, ed, {"command": "undo_edit", "path": "m.py"}, state)
    assert run(local_box.read_file("m.py")) == b"a = 1\nb = 20\nc = 3"
    call(local_box, ed, {"command": "undo_edit", "path": "m.py"}, state)
    assert run(local_box.read_file("m.py")) == b"a = 1\nb = 2\nc = 3"
    call(local_box, ed, {"command": "undo_edit", "path": "m.py"}, state)  # undoes the create
    assert call(local_box, "bash", {"command": "test -e m.py"}).exit_code == 1
    nothing = call(local_box, ed, {"command": "undo_edit", "path": "m.py"}, state)
    assert nothing.is_error and "no edits" in nothing.content


@pytest.mark.bwrap
def test_editor_error_paths(local_box) -> None:
    ed = "str_replace_editor"
    run(local_box.write_file("dup.txt", b"x = 1\nx = 1\n"))
    twice = call(local_box, ed, {"command": "str_replace", "path": "dup.txt", "old_str": "x = 1",
                                 "new_str": "y"})
    assert twice.is_error and "2 times" in twice.content and "[1, 2]" in twice.content
    absent = call(local_box, ed, {"command": "str_replace", "path": "dup.txt", "old_str": "zzz",
                                  "new_str": "y"})
    assert absent.is_error and "does not occur" in absent.content
    missing = call(local_box, ed, {"command": "view", "path": "nope.txt"})
    assert missing.is_error and "no such file" in missing.content
    outside = call(local_box, ed, {"command": "create", "path": "/etc/evil", "file_text": "x"})
    assert outside.is_error
    no_text = call(local_box, ed, {"command": "create", "path": "n.txt"})
    assert no_text.is_error and "file_text" in no_text.content
    bad_line = call(local_box, ed, {"command": "insert", "path": "dup.txt", "insert_line": 99,
                                    "new_str": "z"})
    assert bad_line.is_error and "outside" in bad_line.content
    run(local_box.write_file("run.sh", b"echo one\n", mode=0o755))
    edited = call(local_box, ed, {"command": "str_replace", "path": "run.sh", "old_str": "one",
                                  "new_str": "two"})
    assert not edited.is_error
    assert call(local_box, "bash", {"command": "./run.sh"}).content == "two\n"  # still +x
    run(local_box.exec("mkdir -p pkg/sub && touch pkg/sub/f.py"))
    listing = call(local_box, ed, {"command": "view", "path": "pkg"})
    assert "pkg/sub/f.py" in listing.content and not listing.is_error
    assert run(local_box.read_file("dup.txt")) == b"x = 1\nx = 1\n"  # refused edits change nothing


@pytest.mark.bwrap
def test_search_tool(local_box) -> None:
    run(local_box.write_file("src/a.py", b"def alpha():\n    return 1\n"))
    run(local_box.write_file("src/b.txt", b"alpha beta\n"))
    found = call(local_box, "search", {"pattern": "alpha", "include": "*.py"})
    assert found.content == "./src/a.py:1:def alpha():"
    none = call(local_box, "search", {"pattern": "gamma"})
    assert not none.is_error and "no matches" in none.content
    bad = call(local_box, "search", {"pattern": "("})
    assert bad.is_error and "search failed" in bad.content
    lines = "\n".join(f"hit {i}" for i in range(500)).encode()
    run(local_box.write_file("many.txt", lines))
    many = call(local_box, "search", {"pattern": "hit", "path": "many.txt"})
    assert "500 matches; showing the first 200" in many.content
    assert many.content.startswith("many.txt:1:hit 0\n")
    assert many.content.count("\n") == 200  # 200 match lines, then the note


def test_search_reports_a_sandbox_that_never_ran_grep(tmp_path) -> None:
    """bwrap failing to set up a call (a namespace limit under load, a mount it cannot make)
    exits 1, like grep finding nothing: the tool must say the search failed, not "no matches"."""
    from envhub.envs.sandbox.local import LocalSandbox

    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Resource "
                      "temporarily unavailable' >&2\nexit 1\n")
    broken.chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    box = LocalSandbox(SandboxSpec(exec_timeout_s=20), workdir, bwrap=str(broken))
    result = call(box, "search", {"pattern": "("})
    assert result.is_error and "search failed" in result.content
    assert "namespace failed" in result.content and "no matches" not in result.content


def test_submit_tool_with_dict_state() -> None:
    state: dict = {}
    first = run(call_tool("submit", '{"message": "done"}', None, state))  # type: ignore[arg-type]
    assert first.submitted and not first.is_error and state["submitted"] is True
    second = run(call_tool("submit", "{}", None, state))  # type: ignore[arg-type]
    assert second.is_error and "already submitted" in second.content


@pytest.mark.docker
def test_tools_on_docker() -> None:
    require_docker()
    run_id = "t-tools-docker"

    async def scenario() -> None:
        box = await open_sandbox("docker", SandboxSpec(exec_timeout_s=20), run_id=run_id)
        try:
            state = ToolState()
            r = await call_tool("bash", '{"command": "echo hi > /opt/f.txt && cat /opt/f.txt"}',
                                box, state)
            assert r.content == "hi\n" and not r.is_error
            r = await call_tool("str_replace_editor", json.dumps(
                {"command": "str_replace", "path": "/opt/f.txt", "old_str": "hi",
                 "new_str": "bye"}), box, state)
            assert not r.is_error and (await box.read_file("/opt/f.txt")) == b"bye\n"
            r = await call_tool("search", '{"pattern": "bye", "path": "/opt"}', box, state)
            assert r.content == "/opt/f.txt:1:bye"
            r = await call_tool("bash", '{"command": "sleep 20", "timeout": 1}', box, state)
            assert r.is_error and "timed out" in r.content
        finally:
            await box.close()

    try:
        run(scenario())
    finally:
        reap(run_id)


@pytest.mark.bwrap
def test_tools_on_e2b_fake(monkeypatch) -> None:
    require_tool("bwrap")
    pytest.importorskip("e2b")
    from envhub.envs.sandbox.e2b_fake import running_fake_e2b

    async def scenario() -> None:
        box = await open_sandbox("e2b", SandboxSpec(exec_timeout_s=20), run_id="t-tools-e2b")
        try:
            state = ToolState()
            r = await call_tool("bash", '{"command": "echo hi > f.txt && cat f.txt"}', box, state)
            assert r.content == "hi\n" and not r.is_error
            r = await call_tool("str_replace_editor", json.dumps(
                {"command": "str_replace", "path": "/home/user/f.txt", "old_str": "hi",
                 "new_str": "bye"}), box, state)
            assert not r.is_error and (await box.read_file("f.txt")) == b"bye\n"
            r = await call_tool("search", '{"pattern": "bye"}', box, state)
            assert r.content == "./f.txt:1:bye"
            r = await call_tool("str_replace_editor", '{"command": "view", "path": "nope"}',
                                box, state)
            assert r.is_error
        finally:
            await box.close()

    with running_fake_e2b(api_key="k") as url:
        for key, value in {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_HTTP_VERSION": "1.1",
                           "E2B_API_KEY": "k"}.items():
            monkeypatch.setenv(key, value)
        run(scenario())


@pytest.mark.bwrap
def test_infrastructure_failures_propagate(local_box) -> None:
    from envhub.envs.sandbox import SandboxClosed

    run(local_box.close())
    with pytest.raises(SandboxClosed):  # an env failure for the runner, not a model mistake
        call(local_box, "bash", {"command": "true"})
