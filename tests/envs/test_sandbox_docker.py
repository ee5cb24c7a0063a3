"""Docker sandbox against the real engine, on the debootstrap-built base image."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import SandboxClosed, SandboxError, SandboxFileError, open_sandbox, reap
from tests.envs.bounded_reads import check_bounded_reads
from tests.support import require_docker

pytestmark = pytest.mark.docker


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def base_image() -> str:
    require_docker()
    from envhub.envs.images import ensure_base_image

    return ensure_base_image().tag


@pytest.fixture
def run_id() -> str:
    rid = f"t-docker-{uuid.uuid4().hex[:8]}"
    yield rid
    reap(rid)


@pytest.fixture
def box(base_image: str, run_id: str):
    from envhub.envs.sandbox.docker import DockerSandbox

    spec = SandboxSpec(cpus=0.5, memory_mb=256, exec_timeout_s=30)
    sandbox = run(DockerSandbox.create(spec, base_image, run_id))
    yield sandbox
    run(sandbox.close())


def containers(run_id: str) -> list:
    from envhub.envs.sandbox.engine import docker_client

    return docker_client().containers.list(all=True, filters={"label": f"envhub.run={run_id}"})


def test_exec_output_exit_code_cwd_and_env(box) -> None:
    r = run(box.exec("echo out; echo err >&2; pwd; echo $GREETING; exit 7",
                     env={"GREETING": "hi"}))
    assert (r.exit_code, r.timed_out) == (7, False)
    assert (r.stdout, r.stderr) == ("out\n/workspace\nhi\n", "err\n")
    run(box.exec("mkdir -p sub/dir"))
    assert run(box.exec("pwd", cwd="sub/dir")).stdout == "/workspace/sub/dir\n"
    assert run(box.exec("pwd", cwd="/nope")).exit_code != 0


def test_background_process_does_not_hold_the_call_open(box) -> None:
    r = run(box.exec("sleep 300 & echo started", timeout=20))
    assert r.stdout == "started\n" and not r.timed_out


def test_timeout_kills_the_whole_tree(box) -> None:
    token = uuid.uuid4().hex[:8]
    cmd = (f"bash -c 'exec -a bg-{token} sleep 300' & "
           f"setsid bash -c 'exec -a sid-{token} sleep 301' & sleep 300")
    r = run(box.exec(cmd, timeout=1.5))
    assert r.timed_out and r.exit_code in (124, 137)
    left = run(box.exec(f"ps -eo args | grep -e bg-{token} -e sid-{token} | grep -v grep || true"))
    assert left.stdout == ""


def test_no_network_and_no_host_mounts(box) -> None:
    r = run(box.exec("ls /sys/class/net"))
    assert r.stdout.split() == ["lo"]
    probe = "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)"
    assert run(box.exec(f"python3 -c \"{probe}\"")).exit_code != 0
    box.container.reload()
    attrs = box.container.attrs
    assert attrs["Mounts"] == []
    assert attrs["HostConfig"]["NetworkMode"] == "none"
    assert attrs["HostConfig"]["NanoCpus"] == 500_000_000
    assert attrs["HostConfig"]["Memory"] == 256 << 20
    assert attrs["HostConfig"]["PidsLimit"] > 0
    assert attrs["Config"]["Labels"]["envhub.sandbox"] == "1"


def test_file_round_trips(box, tmp_path: Path) -> None:
    run(box.write_file("a/b/c.bin", bytes(range(256)), mode=0o755))
    assert run(box.read_file("/workspace/a/b/c.bin")) == bytes(range(256))
    assert run(box.exec("stat -c %a a/b/c.bin")).stdout.strip() == "755"
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "x.txt").write_text("x")
    run(box.upload(str(tree), "/opt/up"))
    assert run(box.exec("cat /opt/up/sub/x.txt")).stdout == "x"
    run(box.download("/opt/up", str(tmp_path / "back")))
    assert (tmp_path / "back" / "sub" / "x.txt").read_text() == "x"
    with pytest.raises(SandboxFileError, match="no such file"):
        run(box.read_file("missing.txt"))
    with pytest.raises(SandboxFileError, match="not a regular file"):
        run(box.read_file("a"))


def test_close_removes_the_container(box, run_id: str) -> None:
    assert len(containers(run_id)) == 1
    run(box.close())
    assert containers(run_id) == []
    with pytest.raises(SandboxClosed):
        run(box.exec("true"))


def test_reap_removes_every_container_of_a_run(base_image: str, run_id: str) -> None:
    async def scenario() -> None:
        for _ in range(2):
            await open_sandbox("docker", SandboxSpec(image=base_image), run_id=run_id)

    run(scenario())
    assert len(containers(run_id)) == 2
    removed = reap(run_id)
    assert len(removed) == 2 and containers(run_id) == []


def test_missing_image_is_a_clear_error(run_id: str) -> None:
    require_docker()
    with pytest.raises(SandboxError, match="never pulled"):
        run(open_sandbox("docker", SandboxSpec(image="envhub/does-not-exist:1"), run_id=run_id))
    assert containers(run_id) == []


OWNER = textwrap.dedent("""
    import asyncio, sys, time
    from envhub.envs.manifest import SandboxSpec
    from envhub.envs.sandbox import open_sandbox
    async def main():
        box = await open_sandbox("docker", SandboxSpec(image=sys.argv[1]), run_id=sys.argv[2])
        print(box.id, flush=True)
        await asyncio.sleep(600)
    asyncio.run(main())
""")


def _start_owner(image: str, run_id: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, image, run_id], stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).parents[2])
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip(), "the owner process did not start a sandbox"
    return proc


def test_sigterm_of_the_owner_removes_its_containers(base_image: str, run_id: str) -> None:
    proc = _start_owner(base_image, run_id)
    assert len(containers(run_id)) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    assert containers(run_id) == []


def test_stale_reap_after_sigkill(base_image: str, run_id: str) -> None:
    proc = _start_owner(base_image, run_id)
    os.kill(proc.pid, signal.SIGKILL)  # no handler can run: the container is left behind
    proc.wait(timeout=30)
    assert len(containers(run_id)) == 1
    assert reap(run_id, stale_only=True) != []
    assert containers(run_id) == []


def test_base_image_is_cached(base_image: str) -> None:
    from envhub.envs.images import ensure_base_image

    again = ensure_base_image()
    assert again.cached and again.tag == base_image and again.size_bytes > 0


def test_reads_are_bounded_before_the_bytes_arrive(box) -> None:
    check_bounded_reads(box)


def test_output_written_around_the_wrapper_is_capped_on_the_host(box) -> None:
    """The wrapper caps each stream with `head -c`, but its own stdout is the exec's stream and
    a command can write there directly (/proc/<wrapper pid>/fd/N): 100 MB that way is cut at the
    cap on the host, the command is killed and told why."""
    from envhub.envs.sandbox.shell import MAX_STREAM_BYTES

    # the wrapper shell keeps the exec's pipes open (its own stdout, saved while it runs the
    # command with its output in a file): the first pipe among its fds
    flood = ("w=$(awk '{print $4}' /proc/$PPID/stat); "
             "for f in /proc/$w/fd/*; do case $(readlink $f) in pipe:*) p=$f; break;; esac; "
             "done; head -c 100000000 /dev/zero > $p; echo finished")
    result = run(box.exec(flood, timeout=60))
    assert len(result.stdout) <= MAX_STREAM_BYTES, len(result.stdout)
    assert "output past the cap was dropped" in result.stderr, result.stderr[-500:]
    assert "finished" not in result.stdout
    assert run(box.exec("echo still works")).stdout == "still works\n"


def test_a_container_stopped_from_inside_is_started_again(box) -> None:
    """`kill -9 -1` from a command ends the container's main process and so the container: the
    sweep after the call found it stopped, its `kill` failed and the rollout became an
    env_failure. The agent did it: the container is started again (its files kept, its
    processes gone) and the next call runs."""
    run(box.write_file("kept.txt", b"still here"))
    run(box.exec("kill -9 -1; sleep 1", timeout=30))
    assert run(box.exec("cat kept.txt", timeout=30)).stdout == "still here"
    assert run(box.end_processes()) in ("swept", "restarted")


def test_a_command_printing_the_runtimes_exec_failure_runs_once(box) -> None:
    """An exec the runtime refused because its container was stopping is run again once the
    container is started again. A command that only prints the runtime's words, in a running
    container, is not run a second time."""
    for words in ("OCI runtime exec failed: exec failed: cannot exec in a stopped state: "
                  "unknown", "cannot exec in a stopped state: unknown"):
        run(box.write_file("count.txt", b""))
        result = run(box.exec(f"echo ran >> count.txt; echo '{words}'; exit 126", timeout=30))
        assert result.exit_code == 126
        assert run(box.read_file("count.txt")) == b"ran\n"


def test_output_survives_a_client_slow_to_read_the_exec_response(box) -> None:
    """Another thread holding the GIL (in CI: the thread reading a flood of output from another
    container) delays the reading of the exec's response headers until the command's output has
    arrived behind them. docker-py's stream would lose that output (a grading command came back
    with exit 1 and nothing printed); the sandbox reads it through the response's buffer."""
    import threading

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.2)  # the spinner keeps the GIL for 0.2 s at a time
    spinner.start()
    try:
        results = [run(box.exec(f"echo out {i}; echo err {i} >&2; exit 1", timeout=30))
                   for i in range(10)]
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        spinner.join()
    assert [(r.exit_code, r.stdout, r.stderr) for r in results] == [
        (1, f"out {i}\n", f"err {i}\n") for i in range(10)]
