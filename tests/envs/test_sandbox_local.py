"""Local sandbox under real bubblewrap: isolation, timeouts, files."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import SandboxClosed, SandboxFileError, open_sandbox
from envhub.envs.sandbox.local import LocalSandbox
from tests.envs.bounded_reads import check_bounded_reads
from tests.support import host_processes_with, require, require_tool

pytestmark = pytest.mark.bwrap


@pytest.fixture
def box():
    require_tool("bwrap")
    sandbox = asyncio.run(LocalSandbox.create(SandboxSpec(exec_timeout_s=30), run_id="t-local"))
    assert sandbox.isolated
    yield sandbox
    asyncio.run(sandbox.close())


def run(coro):
    return asyncio.run(coro)


def test_exec_output_exit_code_cwd_and_env(box: LocalSandbox) -> None:
    r = run(box.exec("echo out; echo err >&2; pwd; echo $GREETING; exit 7",
                     env={"GREETING": "hi"}))
    assert (r.exit_code, r.timed_out) == (7, False)
    assert r.stdout == "out\n/workspace\nhi\n"
    assert r.stderr == "err\n"
    run(box.exec("mkdir -p sub/dir"))
    assert run(box.exec("pwd", cwd="sub/dir")).stdout == "/workspace/sub/dir\n"
    missing = run(box.exec("pwd", cwd="nope"))
    assert missing.exit_code != 0


def test_host_environment_does_not_leak(box: LocalSandbox, monkeypatch) -> None:
    monkeypatch.setenv("ENVHUB_TEST_SECRET", "s3cret")
    r = run(box.exec("env"))
    assert "s3cret" not in r.stdout
    assert "HOME=/workspace" in r.stdout


def test_timeout_kills_the_whole_tree(box: LocalSandbox) -> None:
    token = f"envhub-bg-{uuid.uuid4().hex[:8]}"
    # a background child, a setsid'ed one (left the process group), and a blocking sleep
    cmd = (f"bash -c 'exec -a {token} sleep 300' & setsid bash -c 'exec -a {token} sleep 301' & "
           "sleep 300")
    r = run(box.exec(cmd, timeout=1.5))
    assert r.timed_out and r.exit_code == 124
    assert "timeout" in r.stderr
    assert host_processes_with(token) == []


def test_background_children_end_with_the_call(box: LocalSandbox) -> None:
    token = f"envhub-bg-{uuid.uuid4().hex[:8]}"
    r = run(box.exec(f"(exec -a {token} sleep 300) & echo started"))
    assert r.stdout == "started\n" and not r.timed_out
    assert host_processes_with(token) == []


def test_no_network(box: LocalSandbox) -> None:
    r = run(box.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"))
    assert r.stdout.split() == ["lo"]
    probe = "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)"
    r = run(box.exec(f"python3 -c \"{probe}\""))
    assert r.exit_code != 0 and "unreachable" in r.stderr.lower()


def test_no_host_write_access(box: LocalSandbox) -> None:
    home = os.path.expanduser("~")
    marker = f"envhub-write-{uuid.uuid4().hex[:8]}"
    for target in (f"/etc/{marker}", f"{home}/{marker}", f"/usr/{marker}", f"/var/{marker}"):
        r = run(box.exec(f"touch {target}"))
        assert r.exit_code != 0, target
        assert not os.path.exists(target), target
    # kernel knobs and remounts are out of reach too (capabilities dropped, /proc/sys ro)
    assert run(box.exec("echo 1 > /proc/sys/kernel/printk")).exit_code != 0
    assert run(box.exec("mount -o remount,rw /etc")).exit_code != 0
    assert run(box.exec("ls /run")).stdout.strip() == ""  # no docker.sock etc.


def test_writes_inside_the_workdir_reach_the_private_dir(box: LocalSandbox) -> None:
    assert run(box.exec("echo data > f.txt && cp f.txt /tmp/ && cat /tmp/f.txt")).exit_code == 0
    assert (box.host_dir / "f.txt").read_text() == "data\n"
    # /tmp is a private tmpfs per call
    assert run(box.exec("test -e /tmp/f.txt")).exit_code == 1


def test_file_round_trips(box: LocalSandbox, tmp_path: Path) -> None:
    run(box.write_file("a/b/c.bin", bytes(range(256))))
    assert run(box.read_file("/workspace/a/b/c.bin")) == bytes(range(256))
    assert run(box.exec("wc -c < a/b/c.bin")).stdout.strip() == "256"
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "x.txt").write_text("x")
    run(box.upload(str(tree), "up"))
    assert run(box.exec("cat up/sub/x.txt")).stdout == "x"
    run(box.download("up", str(tmp_path / "back")))
    assert (tmp_path / "back" / "sub" / "x.txt").read_text() == "x"
    with pytest.raises(SandboxFileError, match="no such file"):
        run(box.read_file("missing.txt"))


def test_file_api_refuses_paths_outside_the_workdir(box: LocalSandbox) -> None:
    with pytest.raises(SandboxFileError, match="inside the workdir"):
        run(box.write_file("/etc/envhub-nope", b"x"))
    with pytest.raises(SandboxFileError, match="inside the workdir"):
        run(box.write_file("../escape.txt", b"x"))
    # a symlink planted by the agent cannot be used to write through
    run(box.exec("ln -s /etc/passwd link"))
    with pytest.raises(SandboxFileError, match="inside the workdir"):
        run(box.write_file("link", b"x"))
    with pytest.raises(SandboxFileError, match="inside the workdir"):
        run(box.read_file("link"))


def test_close_removes_the_workdir_and_refuses_calls(box: LocalSandbox) -> None:
    run(box.close())
    assert not box.host_dir.exists()
    with pytest.raises(SandboxClosed):
        run(box.exec("true"))
    run(box.close())  # idempotent


def test_open_sandbox_local_seeds_files() -> None:
    require_tool("bwrap")

    async def scenario() -> str:
        sandbox = await open_sandbox("local", SandboxSpec(), run_id="t-open",
                                     workdir_files={"main.py": "print(6 * 7)"})
        try:
            return (await sandbox.exec("python3 main.py")).stdout
        finally:
            await sandbox.close()

    assert run(scenario()) == "42\n"


def test_without_bwrap_it_warns_loudly_and_still_runs(tmp_path: Path, capsys) -> None:
    from envhub.envs.sandbox import local

    local._warned = False
    local._warn_unisolated()
    local._warn_unisolated()
    assert capsys.readouterr().err.count("PLAIN SUBPROCESSES") == 1
    plain = LocalSandbox(SandboxSpec(), tmp_path, bwrap=None)
    token = f"envhub-plain-{uuid.uuid4().hex[:8]}"
    r = run(plain.exec(f"pwd; (exec -a {token} sleep 300) & sleep 300", timeout=5))
    assert r.stdout == f"{tmp_path}\n" and r.timed_out
    assert host_processes_with(token) == []


@pytest.mark.parametrize("pids_cgroup", [True, False], ids=["cgroup", "no-cgroup"])
def test_without_bwrap_a_setsid_child_does_not_turn_an_exit_into_a_timeout(
        tmp_path: Path, monkeypatch, pids_cgroup: bool) -> None:
    """A command that ends at once but leaves a process in a session of its own (holding the
    call's pipes) is not reported as timed out and its output is kept: the escapee goes with
    the call's pids cgroup where this host gives one; on a host without (here: its controller's
    folder made absent) the pipes are given up on after a grace, with a note."""
    from envhub.envs.sandbox import local

    if pids_cgroup:
        require(os.geteuid() == 0 and (local._PIDS_V1 / "cgroup.procs").exists(),
                "a pids cgroup (v1) this user may create")
    else:
        monkeypatch.setattr(local, "_PIDS_V1", tmp_path / "no-pids-controller")
    plain = LocalSandbox(SandboxSpec(), tmp_path, bwrap=None)
    token = f"envhub-setsid-{uuid.uuid4().hex[:8]}"
    try:
        # The command ends only once the child is in its own session (the file is written after
        # setsid): ending before that, the call's group kill took the child too on a loaded CI
        # machine, and the pipes closed with nothing to give up on.
        r = run(plain.exec(f"setsid bash -c 'echo up > escaped; exec -a {token} sleep 60' & "
                           "until [ -s escaped ]; do sleep 0.02; done; echo hi; exit 3",
                           timeout=30))
        assert (r.exit_code, r.timed_out, r.stdout) == (3, False, "hi\n"), r
        if pids_cgroup:
            assert r.stderr == "" and host_processes_with(token) == []
        else:
            assert "output pipes stayed open" in r.stderr
    finally:
        subprocess.run(["pkill", "-f", token], check=False)


def test_workdirs_of_a_killed_owner_are_reaped() -> None:
    require_tool("bwrap")
    import signal
    import sys
    import tempfile

    from envhub.envs.sandbox import reap

    run_id = f"t-reap-{uuid.uuid4().hex[:6]}"
    owner = ("import asyncio, sys\n"
             "from envhub.envs.manifest import SandboxSpec\n"
             "from envhub.envs.sandbox import open_sandbox\n"
             "async def main():\n"
             "    box = await open_sandbox('local', SandboxSpec(), run_id=sys.argv[1])\n"
             "    print(box.host_dir, flush=True)\n"
             "    await asyncio.sleep(600)\n"
             "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", owner, run_id], stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).parents[2])
    assert proc.stdout is not None
    workdir = Path(proc.stdout.readline().strip())
    assert workdir.is_dir() and workdir.parent == Path(tempfile.gettempdir())
    assert reap(run_id, stale_only=True) == []  # the owner is alive: not stale
    os.kill(proc.pid, signal.SIGKILL)  # no atexit: the workdir is left behind
    proc.wait(timeout=30)
    assert workdir.is_dir()
    assert reap(run_id, stale_only=True) == [str(workdir)]
    assert not workdir.exists()


@pytest.mark.bwrap
def test_envhub_sources_and_task_data_are_hidden():
    """Built-in environments hold gold patches and hidden tests: an agent in a local sandbox
    must not read them (nor the checkout of an editable install)."""
    import envhub.envs

    require_tool("bwrap")
    tasks = Path(envhub.envs.__file__).parent / "builtin" / "swe_task" / "data" / "tasks.jsonl"
    assert tasks.is_file()

    async def probe() -> tuple:
        sb = await LocalSandbox.create(SandboxSpec(), run_id="hide-test")
        try:
            read = await sb.exec(f"cat {tasks} | head -c 100", timeout=30)
            listing = await sb.exec(f"ls {Path(envhub.envs.__file__).parent}", timeout=30)
            py = await sb.exec("python3 -c 'print(1+1)'", timeout=30)
            return read, listing, py
        finally:
            await sb.close()

    read, listing, py = asyncio.run(probe())
    assert read.exit_code != 0 or read.stdout == ""
    assert "builtin" not in listing.stdout
    assert py.stdout.strip() == "2"  # the system interpreter still works


def test_an_envhub_home_under_the_masked_home_folders_does_not_break_calls(monkeypatch) -> None:
    """The default ENVHUB_HOME is ~/.envhub, under /root or /home, which the sandbox masks with
    a read-only tmpfs: it is hidden already, and bwrap could not mount over it (every call used
    to fail with exit 1 once the folder existed)."""
    import tempfile

    require_tool("bwrap")
    masked = next((p for p in (Path.home(), Path("/root")) if p.parts[1:2] in (("root",),
                                                                             ("home",))), None)
    if masked is None or not os.access(masked, os.W_OK):
        pytest.skip("needs a writable home under /root or /home")
    home = Path(tempfile.mkdtemp(prefix=".envhub-test-", dir=masked))
    try:
        (home / "credentials.json").write_text("{}")
        monkeypatch.setenv("ENVHUB_HOME", str(home))

        async def probe():
            sb = await LocalSandbox.create(SandboxSpec(), run_id="home-test")
            try:
                return await sb.exec(f"echo ok; cat {home}/credentials.json", timeout=30)
            finally:
                await sb.close()

        r = run(probe())
        assert r.stdout.startswith("ok\n") and "{}" not in r.stdout, r.stderr
    finally:
        import shutil

        shutil.rmtree(home, ignore_errors=True)


def test_reads_are_bounded_before_the_bytes_arrive(box) -> None:
    check_bounded_reads(box)
