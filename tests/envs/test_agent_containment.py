"""Command agents run inside the rollout's sandbox (issue 11, hack classes 2 and 4): a hostile
agent, run by the real runner in real docker and bubblewrap sandboxes, tries every way out. It
reaches its own gateway session (the call is in the pool) and nothing else: no loopback or host
server, no docker socket, no writes outside its workdir, no other rollout's files or task data,
no other route or credential at the gateway, and its detached `setsid` loop is gone after the
rollout. The control runs the same agent with --agent-on-host (today's behaviour before this
change): there it escapes, which shows the probes are real.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import socketserver
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from envhub.envs.errors import AgentSpecError
from envhub.orchestrator.groups import EnvChoice, RunConfig, run
from tests.envs.runtime_fixtures.gateway import ADMIN_KEY, FIXTURES, start_gateway
from tests.support import host_processes_with, require_docker, require_tool, trajectory_json

HOSTILE = FIXTURES / "hostile_agent.py"


class _Counting(socketserver.BaseRequestHandler):
    hits: list[str] = []

    def handle(self) -> None:
        self.hits.append(self.client_address[0])


@pytest.fixture
def host_server():
    """A TCP server on every host address; records each connection that reached it."""
    _Counting.hits = []
    server = socketserver.ThreadingTCPServer(("0.0.0.0", 0), _Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], _Counting.hits
    server.shutdown()
    server.server_close()


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    handle, _ = start_gateway(tmp_path, ["Hello from the model."] * 8)
    yield handle
    handle.close()


@pytest.fixture
def secrets_on_host():
    """Files an agent must not read: another rollout's workdir, envhub's task data."""
    other = Path(tempfile.mkdtemp(prefix="envhub-local-other-rollout-"))
    (other / "secret.txt").write_text("another rollout's work")
    import envhub.envs.builtin.swe_task as swe

    gold = Path(swe.__file__).resolve().parent / "data" / "tasks.jsonl"
    assert gold.is_file()
    yield [str(other / "secret.txt"), str(gold)]
    shutil.rmtree(other, ignore_errors=True)


def host_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: picks the outgoing interface
        return s.getsockname()[0]


def run_hostile(gw, port: int, marker: str, paths: list[str], **kw):
    line = " ".join([str(port), host_ip(), marker, *paths])
    if kw.get("agent_on_host"):
        agent = f"{sys.executable} {HOSTILE} {line}"
    else:
        agent, kw["agent_install"] = f"hostile_agent.py {line}", [f"script:{HOSTILE}"]
    config = RunConfig(envs=[EnvChoice.parse("arith")], gateway=gw.url, admin_key=ADMIN_KEY,
                       agent=agent, n=1, k=2, time_limit_s=120, **kw)
    return asyncio.run(run(config, progress=False))


def probes(record) -> dict:
    out = record.agent_info["stdout_tail"]
    (line,) = [x for x in out.splitlines() if x.startswith("PROBE ")]
    return json.loads(line[len("PROBE "):])


KINDS = [pytest.param("local", marks=pytest.mark.bwrap),
         pytest.param("docker", marks=pytest.mark.docker)]


@pytest.mark.parametrize("kind", KINDS)
def test_agent_in_the_sandbox_reaches_only_its_own_session(kind, gateway, host_server,
                                                            secrets_on_host):
    if kind == "docker":
        require_docker()
    else:
        require_tool("bwrap")
    port, hits = host_server
    marker = f"envhub-probe-{uuid.uuid4().hex[:10]}"
    result = run_hostile(gateway, port, marker, secrets_on_host, sandbox=kind)
    assert len(result.records) == 2
    for record in result.records:
        assert record.status == "done", record
        assert record.agent_info["in_sandbox"] == kind
        seen = probes(record)
        assert seen["gateway_chat"] == 200  # its own session works, through the forwarder
        assert seen["key_is_placeholder"]  # the real key never enters the sandbox
        assert seen["admin_route"] == 403 and seen["session_route"] == 403
        assert not seen["loopback_server"] and not seen["host_ip_server"]
        assert not seen["docker_socket"]
        assert seen["workdir_write"]
        assert seen["host_files_read"] == [] and seen["host_folders_written"] == []
        t = trajectory_json(gateway, record.session_id, ADMIN_KEY)
        assert len(t["turns"]) == 1  # the one chat call is in this rollout's session
        assert record.agent_info["gateway_requests"] == 1
        assert record.agent_info["refused_requests"] == 2
    assert hits == []  # nothing reached the host's server, on any address
    assert host_processes_with(marker) == []  # the setsid loop died with the agent phase
    # writes outside the workdir stayed in the sandbox (a private tmpfs root, the container's
    # own layer): nothing on the host
    assert written_on_host(marker, secrets_on_host) == []


def written_on_host(marker: str, paths: list[str]) -> list[str]:
    candidates = [Path(f"/etc/envhub-probe-{marker}"), Path(f"/envhub-probe-{marker}"),
                  *(Path(p).parent / f"pwned-{marker}" for p in paths)]
    return [str(p) for p in candidates if p.exists()]


def test_control_the_same_agent_on_the_host_escapes(gateway, host_server, secrets_on_host):
    """What --agent-on-host (every command agent before this change) can do: the probes are
    real. Cleans up what it leaves (the setsid loop, the /etc file should it survive)."""
    port, hits = host_server
    marker = f"envhub-probe-{uuid.uuid4().hex[:10]}"
    try:
        result = run_hostile(gateway, port, marker, secrets_on_host, agent_on_host=True)
        for record in result.records:
            assert record.status == "done", record
            seen = probes(record)
            assert seen["gateway_chat"] == 200 and not seen["key_is_placeholder"]
            assert seen["loopback_server"] and seen["host_ip_server"]
            assert seen["host_files_read"] == secrets_on_host
            if Path("/var/run/docker.sock").exists():
                assert seen["docker_socket"]
        assert hits
        assert host_processes_with(marker)  # the detached loop outlived the run
        if os.geteuid() == 0:  # as root (CI): /etc and / of the host were written
            assert f"/etc/envhub-probe-{marker}" in written_on_host(marker, secrets_on_host)
    finally:
        for line in host_processes_with(marker):  # only the loop this test started
            os.kill(int(line.split()[0]), signal.SIGKILL)
        for path in written_on_host(marker, secrets_on_host):
            Path(path).unlink()


def test_in_sandbox_agents_refuse_kinds_that_cannot_host_them(gateway):
    with pytest.raises(AgentSpecError, match="--agent-on-host"):
        run_hostile(gateway, 1, "x", [], sandbox="e2b")


def test_agent_install_specs_are_checked_before_anything_runs(gateway):
    for bad, match in (("npm:Not A Package", "npm:NAME@VERSION"), ("script:/no/such", "not a file"),
                       ("wheel:x", "pip:REQUIREMENT")):
        config = RunConfig(envs=[EnvChoice.parse("arith")], gateway=gateway.url,
                           admin_key=ADMIN_KEY, agent="x", agent_install=[bad], n=1)
        with pytest.raises(AgentSpecError, match=match):
            asyncio.run(run(config, progress=False))
