"""Sessions: admin-created keys, isolation, rewards, signals, close, listing."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest
from pydantic import ValidationError

from envhub.gateway.config import GatewayConfig
from envhub.sdk import GatewayError, Session
from tests.gateway.conftest import start
from tests.support import envhub, free_port

ADMIN = "admin-secret"


@pytest.fixture
def secured(tmp_path, tool_script):
    gw = start(tmp_path, tool_script, admin_key=ADMIN)
    yield gw
    gw.close()


def chat(gw, key):
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0
                         ).chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}])


def test_unknown_key_is_401_with_admin_key(secured):
    with pytest.raises(openai.AuthenticationError) as e:
        chat(secured, "made-up")
    assert "POST /sessions" in str(e.value)
    r = httpx.post(f"{secured.url}/sessions", json={})
    assert r.status_code == 401
    assert httpx.get(f"{secured.url}/sessions").status_code == 401


def test_session_keys_isolate_sessions(secured):
    a = Session.open(secured.url, admin_key=ADMIN, group_id="g1", task_id="t1")
    b = Session.open(secured.url, admin_key=ADMIN, group_id="g1", task_id="t1", sample_index=1)
    chat(secured, a.api_key)
    # b's key cannot read or write a's session
    other = Session(secured.url, a.id, b.api_key)
    with pytest.raises(GatewayError) as e:
        other.trajectory()
    assert e.value.status == 403
    with pytest.raises(GatewayError):
        other.reward("outcome", 1.0)
    assert len(a.trajectory().turns) == 1
    assert len(b.trajectory().turns) == 0


def test_rewards_signals_close_and_listing(secured):
    s = Session.open(secured.url, admin_key=ADMIN, group_id="g2", task_id="t")
    chat(secured, s.api_key)
    s.reward("outcome", 1.0, name="tests")
    s.reward("process", -0.1, seq=0, name="tool_error")
    s.signal("tool_error", seq=0, info={"tool": "bash"})
    s.close("env_failure", reason="sandbox crashed")
    t = s.trajectory()
    assert [(r.kind, r.value) for r in t.rewards] == [("outcome", 1.0), ("process", -0.1)]
    # the gateway's own first: the scripted model called `calc`, which `chat` does not declare
    assert [sig.name for sig in t.signals] == ["undeclared_tool", "tool_error"]
    assert t.status.value == "env_failure" and t.session.reason == "sandbox crashed"
    headers = {"authorization": f"Bearer {ADMIN}"}
    rows = httpx.get(f"{secured.url}/sessions", params={"group_id": "g2"},
                     headers=headers).json()
    assert [r["id"] for r in rows] == [s.id]
    assert httpx.get(f"{secured.url}/sessions", params={"status": "done", "group_id": "g2"},
                     headers=headers).json() == []
    # a closed session takes no more calls
    with pytest.raises(openai.ConflictError):
        chat(secured, s.api_key)


def test_bad_session_requests(secured):
    headers = {"authorization": f"Bearer {ADMIN}"}
    r = httpx.post(f"{secured.url}/sessions", json={"sample_index": -1}, headers=headers)
    assert r.status_code == 400 and "sample_index" in r.json()["error"]["message"]
    s = Session.open(secured.url, admin_key=ADMIN)
    r = httpx.post(f"{secured.url}/sessions/{s.id}/reward", json={"kind": "bogus", "value": 1},
                   headers=headers)
    assert r.status_code == 400 and "kind" in r.json()["error"]["message"]
    r = httpx.post(f"{secured.url}/sessions/{s.id}/close", json={"status": "exploded"},
                   headers=headers)
    assert r.status_code == 400
    r = httpx.post(f"{secured.url}/sessions", json={"session_id": s.id}, headers=headers)
    assert r.status_code == 409
    assert httpx.get(f"{secured.url}/sessions/nope/trajectory",
                     headers=headers).status_code == 404


def _get(gw, path, key=None):
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{gw.url}{path}", headers=headers)


def test_a_session_key_reaches_only_its_own_session(secured):
    a = Session.open(secured.url, admin_key=ADMIN)
    b = Session.open(secured.url, admin_key=ADMIN)
    chat(secured, a.api_key)
    assert _get(secured, f"/sessions/{a.id}/trajectory", a.api_key).status_code == 200
    for path in (f"/sessions/{a.id}", f"/sessions/{a.id}/trajectory"):
        r = _get(secured, path, b.api_key)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "permission_error"
        assert b.id in r.json()["error"]["message"]  # says whose key it is
    for op in ("reward", "signal", "close", "context_action"):
        r = httpx.post(f"{secured.url}/sessions/{a.id}/{op}", json={},
                       headers={"authorization": f"Bearer {b.api_key}"})
        assert r.status_code == 403, (op, r.text)
    # whether a session exists is not revealed to another session's key
    assert _get(secured, "/sessions/no-such-session/trajectory", b.api_key).status_code == 403
    # listing, creating and the fleet routes need the admin key: a session key gets 403,
    # an unknown key or none 401
    assert _get(secured, "/sessions", b.api_key).status_code == 403
    assert httpx.post(f"{secured.url}/sessions", json={},
                      headers={"authorization": f"Bearer {b.api_key}"}).status_code == 403
    assert _get(secured, "/admin/fleet", b.api_key).status_code == 403
    assert _get(secured, "/sessions", "made-up").status_code == 401
    assert _get(secured, f"/sessions/{a.id}/trajectory", "made-up").status_code == 401
    assert _get(secured, f"/sessions/{a.id}/trajectory").status_code == 401
    rows = _get(secured, "/sessions", ADMIN).json()
    assert {a.id, b.id} <= {r["id"] for r in rows}
    assert len(_get(secured, f"/sessions/{a.id}/trajectory", ADMIN).json()["turns"]) == 1


def test_local_mode_without_admin_key_stays_open(gateway):
    """Loopback without an admin key: single-user mode, any token opens and reads sessions."""
    chat(gateway, "run-1")
    assert _get(gateway, "/sessions/run-1/trajectory", "run-2").status_code == 200
    assert [r["id"] for r in _get(gateway, "/sessions").json()] == ["run-1"]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_admin_key(host):
    assert GatewayConfig(host=host).admin_key is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "gateway.internal"])
def test_an_exposed_gateway_needs_an_admin_key(host):
    with pytest.raises(ValidationError, match="set --admin-key or ENVHUB_ADMIN_KEY, or listen "
                                              "on 127.0.0.1"):
        GatewayConfig(host=host)
    assert GatewayConfig(host=host, admin_key="k").host == host


def test_cli_refuses_0_0_0_0_without_admin_key(tmp_path):
    port = free_port()
    r = envhub("gateway", "--host", "0.0.0.0", "--port", str(port),
               "--db", f"sqlite:///{tmp_path}/pool.db", timeout=120,
               env={"ENVHUB_ADMIN_KEY": ""})
    assert r.returncode == 2, r.stderr
    assert "set --admin-key or ENVHUB_ADMIN_KEY, or listen on 127.0.0.1" in r.stderr
    assert "envhub gateway on" not in r.stdout  # refused before serving
    assert not (tmp_path / "pool.db").exists()  # nothing was opened either
    with socket.socket() as s:  # and the port was never bound
        s.bind(("127.0.0.1", port))


def test_a_session_opened_not_trainable_records_no_trainable_turn(tmp_path, tool_script):
    """metadata {"trainable": false} (a model judge's calls): every turn is recorded with
    trainable false and loss mask 0, also once another gateway on the pool loads the session."""
    gw = start(tmp_path, tool_script, admin_key=ADMIN)
    try:
        judge = Session.open(gw.url, admin_key=ADMIN, env="judge",
                             metadata={"trainable": False})
        agent = Session.open(gw.url, admin_key=ADMIN, env="e")
        chat(gw, judge.api_key)
        chat(gw, agent.api_key)
        assert [t.trainable for t in agent.trajectory().turns] == [True]
    finally:
        gw.close()
    again = start(tmp_path, tool_script, admin_key=ADMIN)  # same pool: loads it from its row
    try:
        chat(again, judge.api_key)
        t = Session(again.url, judge.id, judge.api_key).trajectory()
        assert [turn.trainable for turn in t.turns] == [False, False]
        assert all(set(s.loss_mask) == {0} for s in t.segments)
    finally:
        again.close()
