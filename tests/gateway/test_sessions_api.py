"""Sessions: admin-created keys, isolation, rewards, signals, close, listing."""

from __future__ import annotations

import httpx
import openai
import pytest

from envhub.sdk import GatewayError, Session
from tests.gateway.conftest import start

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
    assert e.value.status == 401
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
    assert t.signals[0].name == "tool_error"
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
