"""The agent-side SDK against a real gateway on loopback (bundled tokenizer, scripted
completions): open a session, call the model through `.openai()`, report rewards, signals and
context actions, read the trajectory, close. Sync and async twins do the same things."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from envhub.gateway.server import GatewayHandle
from envhub.sdk import AsyncSession, GatewayError, Session, SessionStatus
from tests.support import free_port, gateway_in_thread, scripted_backend

ADMIN = "sdk-admin-key"
ANSWER = "The answer is 2."
QUESTION = [{"role": "user", "content": "1 + 1?"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayHandle]:
    """One gateway for the module; every test opens its own sessions on it."""
    handle = gateway_in_thread(tmp_path_factory.mktemp("sdk"), scripted_backend([ANSWER]),
                               admin_key=ADMIN)
    yield handle
    handle.close()


def ask(client: openai.OpenAI, messages: list[dict]) -> str:
    reply = client.chat.completions.create(model="default", messages=messages)
    return reply.choices[0].message.content


def test_a_session_round_trip(gw: GatewayHandle) -> None:
    s = Session.open(gw.url, admin_key=ADMIN, group_id="g-sync", task_id="t1", env="arith",
                     sample_index=1, metadata={"seed": 3})
    assert s.base_url == f"{gw.url}/v1" and s.api_key and s.id
    client = s.openai(max_retries=0)
    assert ask(client, QUESTION) == ANSWER
    s.reward("outcome", 1.0, name="tests")
    s.reward("process", -0.25, seq=0, name="tool_error", weight=0.5)
    s.signal("tool_error", seq=0, info={"tool": "bash"})

    t = s.trajectory()
    assert (t.session.group_id, t.session.task_id, t.session.env, t.session.sample_index) == (
        "g-sync", "t1", "arith", 1)
    assert t.status == SessionStatus.open
    [turn] = t.turns
    [segment] = t.segments
    # the segment is the prompt plus the sampled tokens; loss only on the sampled ones
    assert segment.token_ids == turn.prompt_delta_ids + turn.completion_ids
    assert sum(segment.loss_mask) == len(turn.completion_ids) > 0
    assert [(r.kind, r.value, r.name) for r in t.rewards] == [
        ("outcome", 1.0, "tests"), ("process", -0.25, "tool_error")]
    assert t.total_reward() == 1.0 - 0.25  # the event's weight is a record, not a factor
    assert t.total_reward({"outcome": 1.0, "process": 0.1}) == 1.0 - 0.25 * 0.1
    assert [(x.name, x.seq, x.info) for x in t.signals] == [("tool_error", 0, {"tool": "bash"})]

    s.close("done")
    assert s.trajectory().status == SessionStatus.done  # reads still work after close
    with pytest.raises(openai.ConflictError):  # a closed session takes no more model calls
        ask(client, QUESTION)


def test_the_async_twin_round_trip(gw: GatewayHandle) -> None:
    async def main() -> tuple[str, str]:
        async with await AsyncSession.open(gw.url, admin_key=ADMIN, group_id="g-async",
                                           task_id="t2") as s:
            client = s.openai(max_retries=0)
            reply = await client.chat.completions.create(model="default", messages=QUESTION)
            await s.reward("outcome", 0.5)
            await s.signal("slow_tool", value=2.0)
            t = await s.trajectory()
            assert len(t.turns) == 1 and [r.value for r in t.rewards] == [0.5]
            assert t.signals[0].value == 2.0
        return reply.choices[0].message.content, (await s.trajectory()).status.value

    assert asyncio.run(main()) == (ANSWER, "done")


def test_a_declared_context_action_labels_the_next_call(gw: GatewayHandle) -> None:
    with Session.open(gw.url, admin_key=ADMIN) as s:
        client = s.openai(max_retries=0)
        history = [*QUESTION, {"role": "assistant", "content": ask(client, QUESTION)},
                   {"role": "user", "content": "and 2 + 2?"}]
        ask(client, history)
        s.context_action("summarize", info={"strategy": "agent-summary"})
        ask(client, [{"role": "user", "content": "So far: 1 + 1 = 2. And 2 + 2?"}])
        t = s.trajectory()
    assert len(t.segments) == 2  # a context action starts a new segment
    [action] = t.cm_actions
    assert (action.kind, action.source, action.seq) == ("summarize", "declared", 2)
    assert action.info["strategy"] == "agent-summary"


def test_async_context_action_and_explicit_aclose(gw: GatewayHandle) -> None:
    async def main() -> None:
        s = await AsyncSession.open(gw.url, admin_key=ADMIN)
        client = s.openai(max_retries=0)
        await client.chat.completions.create(model="default", messages=QUESTION)
        await s.context_action("reset")
        await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "new problem"}])
        await s.aclose("env_failure", reason="sandbox crashed")
        await s.aclose()  # idempotent: the first status stands
        t = await s.trajectory()
        assert [(a.kind, a.source) for a in t.cm_actions] == [("reset", "declared")]
        assert t.status == SessionStatus.env_failure and t.session.reason == "sandbox crashed"
        await s.aclose()  # releases the client the read reopened

    asyncio.run(main())


def test_a_with_block_closes_done_or_agent_error_and_keeps_an_explicit_close(
        gw: GatewayHandle) -> None:
    with Session.open(gw.url, admin_key=ADMIN) as ok:
        pass
    with pytest.raises(ValueError), Session.open(gw.url, admin_key=ADMIN) as failed:
        raise ValueError("agent crashed")
    with Session.open(gw.url, admin_key=ADMIN) as explicit:
        explicit.close(SessionStatus.env_failure, reason="no sandbox")
    assert ok.trajectory().status == SessionStatus.done
    t = failed.trajectory()
    assert t.status == SessionStatus.agent_error and "agent crashed" in t.session.reason
    assert explicit.trajectory().status == SessionStatus.env_failure  # not overwritten


def test_close_releases_the_http_client(gw: GatewayHandle) -> None:
    s = Session.open(gw.url, admin_key=ADMIN)
    http = s._http
    s.close()
    assert http.is_closed


def test_bad_keys_are_refused_with_what_to_fix(gw: GatewayHandle) -> None:
    with pytest.raises(GatewayError) as e:
        Session.open(gw.url, admin_key="not-the-admin-key")
    assert e.value.status == 401 and "admin key" in str(e.value)
    with pytest.raises(GatewayError) as e:
        Session.open(gw.url)  # this gateway has an admin key: opening needs it
    assert e.value.status == 401

    mine = Session.open(gw.url, admin_key=ADMIN)
    theirs = Session.open(gw.url, admin_key=ADMIN)
    stolen = Session(gw.url, theirs.id, mine.api_key)  # my key, their session
    for call in (stolen.trajectory, lambda: stolen.context_action("reset")):
        with pytest.raises(GatewayError) as e:
            call()
        assert e.value.status == 403 and "does not belong to that session" in str(e.value)
    for write in (lambda: stolen.reward("outcome", 1.0), lambda: stolen.signal("x")):
        with pytest.raises(GatewayError) as e:  # the admin key only, whoever's key it is
            write()
        assert e.value.status == 403 and "admin key" in str(e.value)
    with pytest.raises(openai.AuthenticationError):
        Session(gw.url, mine.id, "made-up-key").openai(max_retries=0).chat.completions.create(
            model="default", messages=QUESTION)
    mine.close()
    theirs.close()


def test_an_agent_holding_its_own_key_cannot_score_or_close_its_session(
        gw: GatewayHandle) -> None:
    """The key an agent holds reaches its model calls and its own trajectory, never its reward
    or its status: a reward with a large weight (its composite would be whatever it posts) and a
    close as env_failure (dropped from training) are 403; the runner's admin-key session writes
    both, and what the pool holds is the runner's."""
    runner = Session.open(gw.url, admin_key=ADMIN)
    agent = Session(gw.url, runner.id, runner.api_key)  # what the agent is given
    with pytest.raises(GatewayError) as e:
        agent.reward("outcome", 1.0, weight=1000.0)
    assert e.value.status == 403 and "admin key" in str(e.value)
    for body in ({"events": [{"kind": "custom", "value": 50.0, "weight": 20.0}]},
                 {"kind": "outcome", "value": 1.0}):
        forged = httpx.post(f"{gw.url}/sessions/{runner.id}/reward", json=body,
                            headers={"authorization": f"Bearer {runner.api_key}"})
        assert forged.status_code == 403, forged.text
    forged = httpx.post(f"{gw.url}/sessions/{runner.id}/close",
                        json={"status": "env_failure", "reason": "not my fault"},
                        headers={"authorization": f"Bearer {runner.api_key}"})
    assert forged.status_code == 403, forged.text
    agent.close("env_failure", "not my fault")  # releases the client; the status is not its call
    assert agent.trajectory().session.status.value == "open"
    with pytest.raises(GatewayError) as e:  # signals feed the reward: the runner's only
        agent.signal("tool_error")
    assert e.value.status == 403
    runner.reward("outcome", 0.0)
    runner.close("done")
    traj = runner.trajectory()
    assert traj.session.status.value == "done" and traj.session.reason is None
    assert [(r.kind, r.value, r.weight) for r in traj.rewards] == [("outcome", 0.0, None)]


def test_bad_requests_name_the_field(gw: GatewayHandle) -> None:
    with Session.open(gw.url, admin_key=ADMIN) as s:
        with pytest.raises(GatewayError) as e:
            s.reward("bogus", 1.0)
        assert e.value.status == 400 and "kind" in str(e.value)
        with pytest.raises(GatewayError) as e:
            s.context_action("compress")
        assert e.value.status == 400 and "kind" in str(e.value)
    with pytest.raises(GatewayError) as e:
        Session.open(gw.url, admin_key=ADMIN, sample_index=-1)
    assert e.value.status == 400 and "sample_index" in str(e.value)


def test_no_gateway_is_a_connection_error(tmp_path: Path) -> None:
    with pytest.raises(httpx.ConnectError):
        Session.open(f"http://127.0.0.1:{free_port()}", admin_key=ADMIN)


def test_the_twins_have_the_same_methods() -> None:
    """httpx's convention: the same names, `close` / `aclose`; async ones are coroutines."""
    def public(cls: type) -> dict[str, object]:
        return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_")}

    sync, asyn = public(Session), public(AsyncSession)
    assert set(sync) - {"close"} == set(asyn) - {"aclose"}
    for name in set(sync) - {"open", "openai", "base_url", "close"}:
        assert inspect.iscoroutinefunction(asyn[name]), name
    assert inspect.iscoroutinefunction(asyn["aclose"])
    assert inspect.signature(Session.close) == inspect.signature(AsyncSession.aclose)


def test_the_sdk_imports_light() -> None:
    """Agents import the SDK without the server, torch or the openai package."""
    heavy = ("openai", "fastapi", "uvicorn", "sqlalchemy", "torch", "transformers",
             "envhub.gateway")
    code = f"import sys, envhub.sdk; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
