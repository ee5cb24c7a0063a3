"""Issue 25, class 6: rewards an agent holding its session key cannot forge.

Against a real gateway (scripted completions, SQLite pool) and the trainer's real readers:
- signals are the runner's (admin key) only; a session key is refused whatever header it uses;
- a CM action the agent declares stays a label: where it sits is the gateway's to fill in;
- the trainer keeps only reward events the gateway stamped as the runner's, and counts the rest;
- the composite weighs each event by the environment's manifest table, never by the event's
  own `weight` (a buggy environment posting weight 1000 with the admin key included).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from envhub.gateway.pool.store import op_event
from envhub.gateway.server import GatewayHandle
from envhub.sdk import GatewayError, Session
from envhub.sdk.types import RUNNER, RewardEvent
from envhub.trainer.advantages import composite_reward
from envhub.trainer.batch import build_batch
from envhub.trainer.config import AdvantageConfig, FilterConfig, TrainerConfig
from envhub.trainer.source import Group, HttpSource, StoreSource
from tests.support import gateway_in_thread, scripted_backend

ADMIN = "provenance-admin-key"
MANIFEST = {"outcome": 1.0, "process": 0.1, "time": 0.05}  # arith's [rewards] table


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayHandle]:
    handle = gateway_in_thread(tmp_path_factory.mktemp("prov"), scripted_backend(["4"]),
                               admin_key=ADMIN)
    yield handle
    handle.close()


def played(gw: GatewayHandle, group: str, sample: int = 0, env: str = "arith") -> Session:
    """A runner's session (admin key) with one model call made by its agent."""
    s = Session.open(gw.url, admin_key=ADMIN, group_id=group, task_id="t", env=env,
                     sample_index=sample)
    Session(gw.url, s.id, s.api_key).openai(max_retries=0).chat.completions.create(
        model="default", messages=[{"role": "user", "content": "2 + 2?"}])
    return s


def config(**advantages: object) -> TrainerConfig:
    return TrainerConfig(advantages=AdvantageConfig(**advantages),  # type: ignore[arg-type]
                         filters=FilterConfig())


# -- signals and CM actions ---------------------------------------------------------------

@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_a_session_key_cannot_post_a_signal(gw: GatewayHandle, header: str) -> None:
    """Signals feed the process reward (and any environment component that reads them): the
    agent's own key is refused, bearer or x-api-key alike; the runner's session posts them."""
    runner = played(gw, f"g-sig-{header}")
    value = runner.api_key if header == "x-api-key" else f"Bearer {runner.api_key}"
    r = httpx.post(f"{gw.url}/sessions/{runner.id}/signal", headers={header: value},
                   json={"name": "tool_error", "seq": 0, "value": -5.0})
    assert r.status_code == 403, r.text
    assert "admin key" in r.json()["error"]["message"]
    agent = Session(gw.url, runner.id, runner.api_key)
    with pytest.raises(GatewayError) as e:  # through the SDK too
        agent.signal("tool_error", seq=0)
    assert e.value.status == 403
    runner.signal("tool_error", seq=0, info={"tool": "bash"})  # the runner's own: recorded
    assert [s.name for s in runner.trajectory().signals] == ["tool_error"]


def test_a_declared_cm_action_is_only_a_label(gw: GatewayHandle) -> None:
    """An agent's declaration is kept (agents declare through the SDK) but where it sits is the
    gateway's: a forged `from_seq` (the turn the conversation left, which ties turns to their
    chain) is replaced by the gateway's own, and the composite is untouched by it."""
    runner = played(gw, "g-cm")
    agent = Session(gw.url, runner.id, runner.api_key)
    agent.context_action("summarize", seq=7, segment=9, from_seq=41,
                         info={"reward": 1000.0, "weight": 1000.0})
    agent.openai(max_retries=0).chat.completions.create(
        model="default", messages=[{"role": "user", "content": "start over: 3 + 3?"}])
    runner.reward("outcome", 1.0, name="verifier")
    runner.close("done")
    t = runner.trajectory()
    [action] = [a for a in t.cm_actions if a.source == "declared"]
    assert (action.seq, action.from_seq) == (1, 0), action  # the gateway's, not 7 / 41
    assert action.segment in (None, 1)
    assert composite_reward(t, AdvantageConfig(reward_weights=MANIFEST)) == 1.0


# -- provenance -----------------------------------------------------------------------------

def _group(gw: GatewayHandle, name: str, outcomes: list[float]) -> list[Session]:
    sessions = [played(gw, name, i) for i in range(len(outcomes))]
    for s, v in zip(sessions, outcomes, strict=True):
        s.reward("outcome", v, name="verifier")
    return sessions


@pytest.mark.parametrize("reader", ["store", "http"])
def test_the_trainer_ignores_and_counts_rewards_its_runner_did_not_write(
        gw: GatewayHandle, reader: str) -> None:
    sessions = _group(gw, f"g-prov-{reader}", [0.0, 1.0])
    store = gw.app.state.gw.store
    # Rows the runner did not write, beside its own on the failing sample (another writer on a
    # shared pool, a gateway from before provenance, a bug): outcome 1000 with no stamp, and a
    # custom 50 stamped by someone else.
    asyncio.run(store.write(
        op_event("rewards", sessions[0].id, {"kind": "outcome", "value": 1000.0}),
        op_event("rewards", sessions[0].id, {"kind": "custom", "value": 50.0,
                                             "writer": "session"})))
    for s in sessions:
        s.close("done")
    source = StoreSource(store) if reader == "store" else HttpSource(gw.url, ADMIN)
    [info] = [g for g in source.list_groups() if g.group_id == f"g-prov-{reader}"]
    group = Group(info.group_id, source.fetch([s.id for s in info.sessions]))
    assert len(group.trajectories[0].rewards) == 3  # what the pool holds
    batch = build_batch([group], config(reward_weights=MANIFEST), trainer_version=0)
    assert batch.rewards == [0.0, 1.0]  # the runner's verdicts, not 1000
    assert batch.metrics()["drop_rewards/not_from_runner"] == 2.0
    [low, high] = sorted(batch.sequences, key=lambda q: q.reward)
    assert low.sample_advantage < 0 < high.sample_advantage


def test_the_gateway_stamps_the_writer_whatever_the_body_says(gw: GatewayHandle) -> None:
    """`writer` is not the client's to set: the admin-key route stamps "runner" over whatever
    was sent, and the session key cannot reach the route at all."""
    s = played(gw, "g-stamp")
    r = httpx.post(f"{gw.url}/sessions/{s.id}/reward",
                   json={"kind": "outcome", "value": 0.5, "writer": "whoever"},
                   headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{gw.url}/sessions/{s.id}/reward",
                   json={"kind": "outcome", "value": 1.0, "writer": RUNNER},
                   headers={"authorization": f"Bearer {s.api_key}"})
    assert r.status_code == 403
    assert [(e.value, e.writer) for e in s.trajectory().rewards] == [(0.5, RUNNER)]


# -- weights from the manifest --------------------------------------------------------------

def test_an_event_weight_of_1000_from_the_admin_key_is_not_the_composite(
        gw: GatewayHandle) -> None:
    """A buggy environment's component posts weight 1000 through the runner: the event is the
    runner's, but its weight is a record; the manifest's table weighs it."""
    s = played(gw, "g-w1000")
    s.reward("outcome", 1.0, name="verifier", weight=1000.0)
    s.reward("process", -1.0, seq=0, name="tool_error", weight=1000.0)
    s.close("done")
    t = s.trajectory()
    assert composite_reward(t, AdvantageConfig(reward_weights=MANIFEST)) == pytest.approx(0.9)
    assert t.total_reward(MANIFEST) == pytest.approx(0.9)
    assert t.total_reward() == pytest.approx(0.0)  # no table: every kind weighs 1.0


def test_each_environment_is_weighed_by_its_own_manifest(gw: GatewayHandle) -> None:
    """`env_reward_weights` (filled by `envhub train` from each environment's manifest) picks
    the table by the session's env; an environment not listed gets `reward_weights`."""
    cfg = AdvantageConfig(reward_weights={"outcome": 1.0},
                          env_reward_weights={"cheap": {"outcome": 0.5, "custom.bonus": 0.0}})
    rewards = {}
    for env in ("cheap", "other"):
        s = played(gw, f"g-env-{env}", env=env)
        s.reward("outcome", 1.0, name="verifier", weight=1.0)
        s.reward("custom", 100.0, name="bonus", weight=1.0)
        s.close("done")
        rewards[env] = composite_reward(s.trajectory(), cfg)
    # "other": custom is not in its table, so it weighs 0 (as the runner's weight_of)
    assert rewards == {"cheap": 0.5, "other": 1.0}


def test_reward_to_go_terms_use_the_manifest_weight_too() -> None:
    from tests.trainer.handmade import trajectory

    t = trajectory("s", "g", reward=1.0, turn_rewards={0: -1.0})
    t.rewards[1] = t.rewards[1].model_copy(update={"weight": 1000.0})
    t.rewards.append(RewardEvent(kind="process", value=-1000.0, seq=0))  # not the runner's
    cfg = TrainerConfig(advantages=AdvantageConfig(reward_weights={"outcome": 1.0,
                                                                   "process": 0.1}))
    from envhub.trainer.advantages import rewards_before_turn

    assert rewards_before_turn(t, cfg.advantages) == {0: 0.0, 1: pytest.approx(-0.1)}
    assert composite_reward(t, cfg.advantages) == pytest.approx(0.9)


@pytest.mark.postgres
def test_provenance_holds_on_a_shared_postgres_pool(postgres_server) -> None:
    """The stamp lives in the stored event (no column to migrate), so a PostgreSQL pool that
    several gateways and writers share keeps it the same: a row another writer put there is
    ignored by a trainer reading the pool directly."""
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.pool.store import Store
    from envhub.gateway.server import run_in_thread

    url = postgres_server.create_database()
    with run_in_thread(GatewayConfig(port=0, db=url, admin_key=ADMIN),
                       backend=scripted_backend(["4"])) as pg:
        sessions = _group(pg, "g-pg", [0.0, 1.0])
        other = Store(url)  # another writer on the shared pool
        try:
            asyncio.run(other.write(op_event("rewards", sessions[0].id,
                                             {"kind": "outcome", "value": 1000.0})))
        finally:
            other.close()
        for s in sessions:
            s.close("done")
    with StoreSource(url) as source:
        [info] = [g for g in source.list_groups() if g.group_id == "g-pg"]
        group = Group(info.group_id, source.fetch([s.id for s in info.sessions]))
    batch = build_batch([group], config(reward_weights=MANIFEST), trainer_version=0)
    assert batch.rewards == [0.0, 1.0]
    assert batch.metrics()["drop_rewards/not_from_runner"] == 1.0
