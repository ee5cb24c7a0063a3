"""Escape attempts from the local (bubblewrap) and docker sandboxes, beyond what
test_sandbox_local.py / test_sandbox_docker.py already cover (outside network, host writes under
bwrap, timeouts): the host's loopback services, the host's home, host writes from docker, and
fork bombs (capped by a process limit, ended by the timeout, nothing left behind)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from envhub.envs.manifest import SandboxSpec
from tests.support import host_processes_with, require, require_docker, require_tool

#: more live processes than any sandbox should allow (docker's pids limit is 1024), yet small
#: enough not to exhaust this host's pid table if a sandbox has no cap at all
FORK_TARGET = 1500

#: forks until it fails or reaches the target; each child execs `sleep` (tiny, tagged with the
#: token) so the count is of live processes; prints how many it got, then kills and reaps them
FORK_COUNTER = """
import os, signal, sys
target, token = int(sys.argv[1]), sys.argv[2]
children = []
while len(children) < target:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            os.execv('/bin/sleep', [token, '600'])
        finally:
            os._exit(1)
    children.append(pid)
print(len(children), flush=True)
for pid in children:
    os.kill(pid, signal.SIGKILL)
for pid in children:
    os.waitpid(pid, 0)
"""

#: the classic bash fork bomb, tagged so its processes can be found from outside
BOMB = ":(){ :|:& };:"


def run(coro):
    return asyncio.run(coro)


def host_addresses() -> list[str]:
    """127.0.0.1 plus this host's own addresses (e.g. docker's bridge gateway 172.17.0.1)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False)
    return ["127.0.0.1", *out.stdout.split()]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP service on every host interface that must stay unreachable from a sandbox."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    server.settimeout(0.5)
    yield server
    server.close()


def connect_probe(addresses: list[str], port: int) -> str:
    """Shell command trying each address:port; prints REACHED:<addr> for any that connects."""
    addrs = repr(addresses)
    code = (f"import socket\nfor a in {addrs}:\n    try:\n"
            f"        socket.create_connection((a, {port}), timeout=3).close()\n"
            f"        print('REACHED:' + a)\n    except OSError as e:\n"
            f"        print('blocked', a, e)\n")
    return f"python3 -c \"{code}\""


def assert_never_connected(server: socket.socket) -> None:
    with pytest.raises(TimeoutError):
        server.accept()[0].close()


@pytest.fixture
def secret_in_home() -> Iterator[tuple[Path, str]]:
    """A file in the host user's home (e.g. /root) that no sandbox may read."""
    secret = uuid.uuid4().hex
    path = Path.home() / f".envhub-escape-{secret[:8]}"
    path.write_text(secret)
    yield path, secret
    path.unlink(missing_ok=True)


# -- local (bubblewrap) -------------------------------------------------------------------------

@pytest.fixture
def local_box():
    require_tool("bwrap")
    from envhub.envs.sandbox.local import LocalSandbox

    box = run(LocalSandbox.create(SandboxSpec(exec_timeout_s=60), run_id="t-escape"))
    assert box.isolated
    yield box
    run(box.close())


@pytest.mark.bwrap
def test_local_cannot_reach_host_loopback_services(local_box, listener) -> None:
    r = run(local_box.exec(connect_probe(host_addresses(), listener.getsockname()[1])))
    assert "REACHED" not in r.stdout, r.stdout
    assert r.stdout.count("blocked") == len(host_addresses()), r.stderr
    assert_never_connected(listener)


@pytest.mark.bwrap
def test_local_cannot_read_the_host_home(local_box, secret_in_home) -> None:
    path, secret = secret_in_home
    r = run(local_box.exec(f"cat {path}; ls -a {path.parent}"))
    assert secret not in r.stdout and path.name not in r.stdout
    assert run(local_box.exec(f"cat /proc/1/root{path}")).stdout == ""


@pytest.mark.bwrap
def test_local_fork_bomb_is_ended_by_the_timeout_and_leaves_nothing(local_box) -> None:
    """A self-replicating tree (bounded here: 2^9 processes, so this host's shared pid table
    stays safe) is ended by the call's timeout; none of it survives; the host still works."""
    token = f"envhub-bomb-{uuid.uuid4().hex[:8]}"
    bomb = (f"b(){{ if [ $1 -gt 0 ]; then b $(($1-1)) & b $(($1-1)) & fi; "
            f"exec -a {token} sleep 600; }}; b 8")
    r = run(local_box.exec(bomb, timeout=5))
    assert r.timed_out and r.exit_code == 124
    assert host_processes_with(token) == []
    assert run(local_box.exec("echo alive")).stdout == "alive\n"
    assert subprocess.run(["true"], check=False).returncode == 0


@pytest.mark.bwrap
def test_local_caps_the_number_of_processes(local_box) -> None:
    """Each call runs in its own pids cgroup (PIDS_LIMIT): forks beyond it fail."""
    token = f"envhub-forks-{uuid.uuid4().hex[:8]}"
    (local_box.host_dir / "forks.py").write_text(FORK_COUNTER)
    r = run(local_box.exec(f"python3 forks.py {FORK_TARGET} {token}", timeout=60))
    got = int(r.stdout.split()[0])
    assert host_processes_with(token) == []
    assert 0 < got < FORK_TARGET, f"{got} processes started inside the sandbox: no cap"


# -- docker ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_image() -> str:
    require_docker()
    from envhub.envs.images import ensure_base_image

    return ensure_base_image().tag


@pytest.fixture
def docker_box(base_image: str):
    from envhub.envs.sandbox import reap
    from envhub.envs.sandbox.docker import DockerSandbox

    run_id = f"t-escape-{uuid.uuid4().hex[:8]}"
    box = run(DockerSandbox.create(SandboxSpec(cpus=0.5, memory_mb=256, exec_timeout_s=60),
                                   base_image, run_id))
    yield box
    run(box.close())
    reap(run_id)


def container_processes(box) -> list[list[str]]:
    """Processes of the container as the host sees them (needs no pid inside it)."""
    box.container.reload()
    return box.container.top()["Processes"] or []


@pytest.mark.docker
def test_docker_cannot_reach_host_services(docker_box, listener) -> None:
    r = run(docker_box.exec(connect_probe(host_addresses(), listener.getsockname()[1])))
    assert "REACHED" not in r.stdout, r.stdout
    assert r.stdout.count("blocked") == len(host_addresses()), r.stderr
    assert_never_connected(listener)


@pytest.mark.docker
def test_docker_writes_and_reads_stay_in_the_container(docker_box, secret_in_home) -> None:
    path, secret = secret_in_home
    marker = f"envhub-write-{uuid.uuid4().hex[:8]}"
    targets = [f"/etc/{marker}", f"{path.parent}/{marker}", f"/usr/{marker}", f"/tmp/{marker}"]
    run(docker_box.exec(" ; ".join(f"mkdir -p $(dirname {t}); touch {t}" for t in targets)))
    for target in targets:
        assert not os.path.exists(target), target
    r = run(docker_box.exec(f"cat {path}; ls -a {path.parent}; cat /proc/1/root{path}"))
    assert secret not in r.stdout and path.name not in r.stdout


@pytest.mark.docker
def test_docker_caps_the_number_of_processes(docker_box) -> None:
    token = f"envhub-forks-{uuid.uuid4().hex[:8]}"
    run(docker_box.write_file("forks.py", FORK_COUNTER.encode()))
    r = run(docker_box.exec(f"python3 forks.py {FORK_TARGET} {token}", timeout=60))
    got = int(r.stdout.split()[0])
    assert 0 < got < FORK_TARGET, r
    assert host_processes_with(token) == []  # the call's end killed what it started
    assert not any(token in " ".join(p) for p in container_processes(docker_box))


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_docker_fork_bomb_is_contained(docker_box) -> None:
    """The real thing. The pids limit keeps the host safe; when the call ends (timeout or
    not) nothing of the bomb may remain (killed through the container's frozen cgroup from the
    host), and the sandbox must stay usable."""
    run(docker_box.exec(BOMB, timeout=10))
    assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks
    left = container_processes(docker_box)
    assert len(left) <= 2, f"{len(left)} processes of the bomb outlived its call"
    assert run(docker_box.exec("echo alive")).stdout == "alive\n"


#: holds every pid the container may have: forks `sleep`s until fork fails, then waits
HOLD_ALL_PIDS = """
import os, time
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.execv('/bin/sleep', ['{token}', '600'])
time.sleep(600)
"""


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_docker_processes_holding_every_pid_are_ended_from_the_host(docker_box) -> None:
    """With the pids limit full nothing in the container can fork: end_processes still kills
    every process but init and the main one, without restarting the container (a restart
    through the engine can hang on a loaded host); files are kept. (The bomb test above is the
    one the in-container sweep alone could not pass: it was starved by the bomb.)"""
    from envhub.envs.sandbox.docker import PIDS_LIMIT

    require(os.geteuid() == 0, "root (the container's cgroup is written from the host)")
    token = f"envhub-hold-{uuid.uuid4().hex[:8]}"
    run(docker_box.write_file("kept.txt", b"kept"))
    docker_box.container.exec_run(["python3", "-c", HOLD_ALL_PIDS.replace("{token}", token)],
                                  detach=True)
    deadline = time.monotonic() + 120
    while len(container_processes(docker_box)) < PIDS_LIMIT - 8:
        assert time.monotonic() < deadline, "the container never filled its pids limit"
        time.sleep(0.5)
    assert run(docker_box.end_processes()) == "swept"
    assert len(container_processes(docker_box)) == 2  # docker-init and its `sleep infinity`
    assert run(docker_box.exec("cat kept.txt")).stdout == "kept"


@pytest.mark.docker
def test_the_freezer_found_is_the_containers_own(docker_box) -> None:
    from envhub.envs.sandbox.cgroup import find_freezer

    require(os.geteuid() == 0, "root (the container's cgroup is written from the host)")
    docker_box.container.reload()
    pid = docker_box.container.attrs["State"]["Pid"]
    freezer = find_freezer(pid, docker_box.id)
    assert freezer is not None and docker_box.id in str(freezer.path)
    assert pid in freezer.pids()
    assert find_freezer(os.getpid(), docker_box.id) is None  # not in the container
    assert find_freezer(pid, "0" * 64) is None  # a pid of another container (or host)


# -- nothing outlives its call or the agent phase -----------------------------------------------

#: ways a tool call leaves a process behind; each is tagged with the token ({t}) to find it
DETACH = {
    "background": "exec -a {t} sleep 300 &",
    "setsid": "setsid sh -c 'exec -a {t} sleep 300' >/dev/null 2>&1 &",
    "nohup": "nohup sh -c 'exec -a {t} sleep 300' >/dev/null 2>&1 &",
    "double_fork_clean_env": "(env -i sh -c '(exec -a {t} sleep 300 &)' &)",
}


@pytest.mark.bwrap
@pytest.mark.parametrize("how", sorted(DETACH))
def test_local_detached_processes_die_with_their_call(local_box, how) -> None:
    token = f"envhub-detach-{uuid.uuid4().hex[:8]}"
    r = run(local_box.exec(DETACH[how].format(t=token) + "\necho started", timeout=30))
    assert r.stdout == "started\n", r
    assert host_processes_with(token) == []
    assert run(local_box.end_processes()) == "swept"


@pytest.mark.docker
@pytest.mark.parametrize("how", sorted(DETACH))
def test_docker_detached_processes_die_with_their_call(docker_box, how) -> None:
    token = f"envhub-detach-{uuid.uuid4().hex[:8]}"
    r = run(docker_box.exec(DETACH[how].format(t=token) + "\necho started", timeout=30))
    assert r.stdout == "started\n", r
    assert not any(token in " ".join(p) for p in container_processes(docker_box))
    assert len(container_processes(docker_box)) == 2  # docker-init and its `sleep infinity`
    assert run(docker_box.exec("echo alive")).stdout == "alive\n"


@pytest.mark.docker
def test_docker_end_processes_kills_what_no_call_started(docker_box) -> None:
    """`docker exec -d` (outside the sandbox API, as a host-run agent with the socket could) is
    not the end of any call: end_processes, run after the agent phase, kills it; files stay."""
    token = f"envhub-detach-{uuid.uuid4().hex[:8]}"
    run(docker_box.write_file("kept.txt", b"kept"))
    docker_box.container.exec_run(["bash", "-c", f"exec -a {token} sleep 300"], detach=True)
    time.sleep(0.5)
    assert any(token in " ".join(p) for p in container_processes(docker_box))
    # a process of `docker exec` is reaped outside the container: the sweep may still see it
    # as a zombie and restart the container to be sure; either way it is gone, files stay
    assert run(docker_box.end_processes()) in ("swept", "restarted")
    assert len(container_processes(docker_box)) == 2
    assert run(docker_box.read_file("kept.txt")) == b"kept"


@pytest.mark.docker
def test_docker_end_processes_reports_a_stopped_container(docker_box) -> None:
    """A container whose main process was killed from inside (the agent's own `kill`) is
    started again, its files kept: the agent's doing, never an env_failure. One stopped from
    outside (`docker kill`: the engine records it) is an infrastructure failure for the runner,
    not something to revive silently."""
    from envhub.envs.sandbox.errors import SandboxError

    run(docker_box.write_file("kept.txt", b"kept"))
    docker_box.container.exec_run(["sh", "-c", "kill -9 $(cat /proc/1/task/1/children)"])
    time.sleep(1)
    assert run(docker_box.end_processes()) in ("swept", "restarted")
    assert run(docker_box.exec("cat kept.txt", timeout=30)).stdout == "kept"
    docker_box.container.kill()
    time.sleep(1)
    with pytest.raises(SandboxError, match="not running"):
        run(docker_box.end_processes())


#: allocates (and touches) far more than the container's memory limit
HOG = "python3 -c \"b = b'x' * (1 << 30)\""


@pytest.mark.docker
def test_docker_end_processes_after_an_oom(docker_box) -> None:
    """A command killed by the container's OOM killer leaves a usable sandbox: end_processes
    sweeps (the container is not restarted) and the next call runs. (A container whose main
    process died is covered by the test above.)"""
    hog = run(docker_box.exec(HOG, timeout=60))
    assert hog.exit_code == 137, hog  # SIGKILL from the OOM killer
    docker_box.container.reload()
    assert docker_box.container.attrs["State"]["Running"]
    assert run(docker_box.end_processes()) == "swept"
    assert run(docker_box.exec("echo alive")).stdout == "alive\n"
