"""The trainer's two pool readers against a real gateway: `HttpSource` over its HTTP API and
`StoreSource` on its store in-process give the same groups and the same trajectories, the
windowed FIFO works on top of either, and listings page past the gateway's 1000-row page."""

from __future__ import annotations

import pytest

from envhub.envs.builtin.arith.env import SCHEMAS
from envhub.sdk import Session
from envhub.trainer.errors import SourceError
from envhub.trainer.source import HttpSource, StoreSource
from envhub.trainer.window import GroupWindow
from tests.envs.runtime_fixtures.gateway import ADMIN_KEY, start_gateway, tool_call


def _play(url: str, group: str, index: int, close: bool, reward: float) -> str:
    """One session of `group`: two turns (a tool call, then an answer), a reward, closed or
    left open. Returns its id."""
    session = Session.open(url, admin_key=ADMIN_KEY, group_id=group, task_id=f"task-{group}",
                           env="arith", sample_index=index)
    client = session.openai()
    messages = [{"role": "user", "content": f"what is {index} + 1?"}]
    tools = [SCHEMAS["calculator"]]  # an undeclared call would come back as text
    first = client.chat.completions.create(model="default", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": str(index + 1)}]
    client.chat.completions.create(model="default", messages=messages, tools=tools)
    session.reward("outcome", reward)
    if close:
        session.close("done")
    return session.id


@pytest.fixture()
def gateway(tmp_path):
    script = [tool_call("calculator", {"expression": "1 + 1"}), "The answer is 2."]
    gw, _ = start_gateway(tmp_path, script)
    yield gw
    gw.close()


def test_http_and_store_sources_agree_and_feed_the_window(gateway) -> None:
    ids = {}
    for n, group in enumerate(["g0", "g1", "g2"]):  # g1 keeps one session open
        ids[group] = [_play(gateway.url, group, i, close=not (group == "g1" and i == 1),
                            reward=float(i)) for i in range(2)]
        assert n == len(ids) - 1
    store = gateway.app.state.gw.store
    with HttpSource(gateway.url, ADMIN_KEY) as http, StoreSource(store) as local:
        for source in (http, local):
            infos = source.list_groups()
            assert [g.group_id for g in infos] == ["g0", "g1", "g2"]  # by start time
            assert [g.finished() for g in infos] == [True, False, True]
            assert [s.id for s in infos[0].sessions] == ids["g0"]  # sample_index order
        every = [sid for group in ids.values() for sid in group]
        from_http, from_store = http.fetch(every), local.fetch(every)
        assert [t.model_dump() for t in from_http] == [t.model_dump() for t in from_store]
        first = from_store[0]
        assert len(first.turns) == 2 and first.segments[0].loss_mask.count(1) > 0
        assert [r.value for r in from_store[1].rewards] == [1.0]
        for source in (http, local):  # W=2: g1 (open) blocks the head; g2 is inside the window
            assert [g.group_id for g in GroupWindow(source, 2).take(3)] == ["g0", "g2"]
        with pytest.raises(SourceError, match="unknown session"):
            local.fetch(["nope"])


@pytest.mark.slow
def test_listings_page_past_the_gateways_page_size(gateway) -> None:
    """1001+ sessions: the gateway answers 1000 rows a call; both sources see them all."""
    store = gateway.app.state.gw.store
    for i in range(1003):
        Session.open(gateway.url, admin_key=ADMIN_KEY, group_id=f"p{i:04d}", task_id="t",
                     env="arith").close("done")
    with HttpSource(gateway.url, ADMIN_KEY) as http, StoreSource(store) as local:
        for source in (http, local):
            infos = source.list_groups()
            assert len(infos) == 1003 and infos[-1].group_id == "p1002"


def test_store_source_opens_a_pool_url_and_reports_a_bad_one(gateway, tmp_path) -> None:
    sid = _play(gateway.url, "solo", 0, close=True, reward=1.0)
    with StoreSource(f"sqlite:///{tmp_path}/pool.db") as source:  # the gateway's own file
        assert [g.group_id for g in source.list_groups()] == ["solo"]
        assert source.fetch([sid])[0].status.value == "done"
    with pytest.raises(SourceError, match="SQLAlchemy URL"):
        StoreSource("nonsense://pool")
