"""The e2b sandbox through the official `e2b` SDK, against the in-repo fake E2B server."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import SandboxClosed, SandboxFileError, SandboxUnavailable, open_sandbox
from tests.envs.bounded_reads import check_bounded_reads
from tests.support import require, require_tool

pytestmark = pytest.mark.bwrap  # the fake's sandboxes are LocalSandboxes under bubblewrap

API_KEY = "e2b_test_key"


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def fake_url():
    require_tool("bwrap")
    try:
        import e2b  # noqa: F401
    except ImportError:
        require(False, "the e2b SDK (pip install 'envhub[e2b]')")
    from envhub.envs.sandbox.e2b_fake import running_fake_e2b

    with running_fake_e2b(api_key=API_KEY) as url:
        yield url


@pytest.fixture
def e2b_env(fake_url: str, monkeypatch) -> str:
    for key, value in {"E2B_API_URL": fake_url, "E2B_SANDBOX_URL": fake_url,
                       "E2B_HTTP_VERSION": "1.1", "E2B_API_KEY": API_KEY}.items():
        monkeypatch.setenv(key, value)
    return fake_url


@pytest.fixture
def box(e2b_env: str):
    run_id = f"t-e2b-{uuid.uuid4().hex[:8]}"
    sandbox = run(open_sandbox("e2b", SandboxSpec(exec_timeout_s=30), run_id=run_id,
                               workdir_files={"seed.txt": "seeded"}, env={"FROM_CREATE": "1"}))
    yield sandbox
    run(sandbox.close())


def listed(url: str, **metadata: str) -> list[dict]:
    import urllib.parse

    params = {"metadata": urllib.parse.urlencode(metadata)} if metadata else {}
    r = httpx.get(f"{url}/v2/sandboxes", params=params, headers={"X-API-Key": API_KEY})
    r.raise_for_status()
    return r.json()


def test_exec_through_the_sdk(box) -> None:
    r = run(box.exec("cat seed.txt; echo; pwd; echo $FROM_CREATE $X; echo err >&2; exit 5",
                     env={"X": "y"}))
    assert (r.exit_code, r.timed_out) == (5, False)
    assert r.stdout == "seeded\n/home/user\n1 y\n"
    assert r.stderr == "err\n"


def test_timeout_kills_the_tree(box) -> None:
    r = run(box.exec("sleep 300 & setsid sleep 301 & sleep 302", timeout=1.5))
    assert r.timed_out and r.exit_code in (124, 137)
    assert run(box.exec("ps -eo args | grep 'sleep 30[0-2]' || true")).stdout == ""


def test_a_sandbox_is_one_machine_for_its_commands(e2b_env: str) -> None:
    """As in E2B's microVM (and the fake, as root), a process a command leaves behind is there
    for the next command: end_processes() is what kills it; a command killing every process it
    can does not end the sandbox; closing it ends whatever is left (on the host too)."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("the fake joins one sandbox's namespaces with nsenter, as root only")
    require_tool("nsenter")
    require_tool("setpriv")

    def count(box, name: str) -> str:
        return run(box.exec(f"ps -eo args | grep -c '^sleep {name[:-1]}[{name[-1]}]' || true")
                   ).stdout

    box = run(open_sandbox("e2b", SandboxSpec(exec_timeout_s=30), run_id="t-e2b-machine"))
    try:
        run(box.exec("setsid sleep 303 >/dev/null 2>&1 &"))
        assert count(box, "303") == "1\n"
        assert run(box.exec("echo shared > /tmp/one")).exit_code == 0
        assert run(box.exec("cat /tmp/one")).stdout == "shared\n"
        run(box.end_processes())
        assert count(box, "303") == "0\n"
        run(box.exec("kill -9 -1"))
        assert run(box.exec("echo alive")).stdout == "alive\n"
        run(box.exec("setsid sleep 304 >/dev/null 2>&1 &"))
        assert count(box, "304") == "1\n"
    finally:
        run(box.close())
    host = subprocess.run(["pgrep", "-f", "^sleep 304$"], capture_output=True, text=True)
    assert host.stdout == "", "a sandbox's process outlived its close"


def test_file_round_trips(box, tmp_path: Path) -> None:
    run(box.write_file("d/e.bin", bytes(range(256))))
    assert run(box.read_file("/home/user/d/e.bin")) == bytes(range(256))
    with pytest.raises(SandboxFileError):
        run(box.read_file("missing.txt"))
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "x.txt").write_text("x")
    run(box.upload(str(tree), "up"))
    assert run(box.exec("cat up/sub/x.txt")).stdout == "x"
    run(box.download("up", str(tmp_path / "back")))
    assert (tmp_path / "back" / "sub" / "x.txt").read_text() == "x"


def test_labels_list_close_and_reap(e2b_env: str) -> None:
    from envhub.envs.sandbox import reap

    run_id = f"t-e2b-{uuid.uuid4().hex[:8]}"

    async def two() -> list:
        return [await open_sandbox("e2b", SandboxSpec(), run_id=run_id) for _ in range(2)]

    boxes = run(two())
    mine = listed(e2b_env, **{"envhub.run": run_id})
    assert sorted(s["sandboxID"] for s in mine) == sorted(b.id for b in boxes)
    assert all(s["metadata"]["envhub.sandbox"] == "1" for s in mine)
    run(boxes[0].close())
    assert [s["sandboxID"] for s in listed(e2b_env, **{"envhub.run": run_id})] == [boxes[1].id]
    assert reap(run_id) == [boxes[1].id]
    assert listed(e2b_env, **{"envhub.run": run_id}) == []
    with pytest.raises(SandboxClosed):
        run(boxes[1].exec("true"))


def test_sdk_control_plane_calls(e2b_env: str) -> None:
    from e2b import AsyncSandbox

    async def scenario() -> None:
        sandbox = await AsyncSandbox.create(template="base", timeout=60)
        try:
            info = await sandbox.get_info()
            assert info.sandbox_id == sandbox.sandbox_id and info.template_id == "base"
            await sandbox.set_timeout(120)
            later = await sandbox.get_info()
            assert later.end_at > info.end_at
            assert await sandbox.is_running()
            await sandbox.files.write("/home/user/t.txt", "text")
            assert await sandbox.files.read("/home/user/t.txt") == "text"
            result = await sandbox.commands.run("echo $((6*7))")
            assert result.stdout == "42\n" and result.exit_code == 0
        finally:
            assert await sandbox.kill()
        assert not await AsyncSandbox.kill(sandbox.sandbox_id)  # already gone: False

    run(scenario())


def test_fake_answers_errors_in_the_api_shape(e2b_env: str) -> None:
    headers = {"X-API-Key": API_KEY}
    r = httpx.post(f"{e2b_env}/v2/sandboxes", json={"templateID": "base", "timeout": -1},
                   headers=headers)
    assert r.status_code == 400 and set(r.json()) == {"code", "message"}
    assert httpx.post(f"{e2b_env}/v2/sandboxes", content=b"{", headers=headers).status_code == 400
    r = httpx.post(f"{e2b_env}/v2/sandboxes", json={"templateID": "base"},
                   headers={"X-API-Key": "wrong"})
    assert r.status_code == 401 and "E2B_API_KEY" in r.json()["message"]
    assert httpx.delete(f"{e2b_env}/sandboxes/nope", headers=headers).status_code == 404
    assert httpx.get(f"{e2b_env}/files", params={"path": "/x"}).status_code == 502


def test_missing_api_key_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(SandboxUnavailable, match="E2B_API_KEY"):
        run(open_sandbox("e2b", SandboxSpec()))


def test_wrong_api_key_is_a_clear_error(e2b_env: str, monkeypatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", "e2b_wrong")
    with pytest.raises(SandboxUnavailable, match="E2B_API_KEY"):
        run(open_sandbox("e2b", SandboxSpec()))


def test_reads_are_bounded_before_the_bytes_arrive(box) -> None:
    check_bounded_reads(box)


# the wrapper shell keeps the exec's pipe open (its own stdout, saved while it runs the command
# with its output in a file): a command can write there directly, around the wrapper's
# `head -c` (issue 25, class 7). The first pipe among the wrapper's fds.
AROUND_THE_WRAPPER = ("w=$(awk '{{print $4}}' /proc/$PPID/stat); "
                      "for f in /proc/$w/fd/*; do case $(readlink $f) in pipe:*) p=$f; break;; "
                      "esac; done; [ -n \"$p\" ] || exit 99; {writer} > $p; echo finished")


@pytest.mark.parametrize("writer", [
    "head -c 100000000 /dev/zero",
    # multi-byte text: the cap counts bytes, not characters
    "yes 'ééééééééééééééééééééééééééééééé' | head -c 100000000",
])
def test_output_written_around_the_wrapper_is_capped_on_the_host(box, writer: str) -> None:
    """100 MB written to the exec's own stream are cut at the cap on the host (before they
    pile up in the SDK's buffers: read whole they took ~20 s here), the command is killed and the
    call says why."""
    import time

    from envhub.envs.sandbox.shell import MAX_STREAM_BYTES

    start = time.monotonic()
    result = run(box.exec(AROUND_THE_WRAPPER.format(writer=writer), timeout=60))
    took = time.monotonic() - start
    assert result.exit_code != 99, "the wrapper's saved pipe was not found"
    assert len(result.stdout.encode()) <= MAX_STREAM_BYTES, len(result.stdout)
    assert "output past the cap was dropped" in result.stderr, result.stderr[-300:]
    assert "finished" not in result.stdout and not result.timed_out
    assert took < 30, f"{took:.1f}s: the flood was read to its end"
    # the writer died with the command; the sandbox goes on
    assert run(box.exec("ps -eo args | grep -c '[h]ead -c 100000000' || true")).stdout == "0\n"
    assert run(box.exec("echo still works")).stdout == "still works\n"


def test_output_under_the_cap_arrives_whole(box) -> None:
    """Streaming changes nothing below the cap: 6 MB on stdout, stderr beside it."""
    result = run(box.exec("head -c 6000000 /dev/zero | tr '\\0' x; echo done >&2"))
    assert (result.exit_code, len(result.stdout), result.stderr) == (0, 6_000_000, "done\n")
