"""`envhub train --schedule` in a real asynchronous run (embedded gateway and engine, a
command-line agent per rollout): the order rollouts start in, read back from the pool (a
session is opened as its rollout starts). With seer the producer launches groups up to
`--buffer` and one probe per group starts before any group's other samples; with fifo (the
default) a group's samples start together, group after group."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
AGENT = Path(__file__).parent / "data" / "hold_agent.py"


def start_order(tmp_path: Path, schedule: str) -> tuple[list[tuple[int, int]], list[dict]]:
    """(launch index of the group, sample index) of every session, in start order."""
    from envhub.gateway.pool.store import Store
    from envhub.orchestrator.train import TrainLoopConfig, train

    # hold_agent: two model calls; it holds only on a task that is not in the run
    agent = shlex.join([sys.executable, str(AGENT), "{task_id}", "no-such-task", "file",
                        str(tmp_path / "unused")])
    out = tmp_path / schedule
    cfg = TrainLoopConfig.model_validate({
        "envs": ["arith"], "steps": 1, "seed": 0, "out": out, "groups": 2, "k": 3,
        "concurrency": 1, "buffer": 4, "tasks": 4, "eval_every": 0, "agent": agent,
        "agent_on_host": True, "schedule": schedule})
    rows = train(cfg, log=lambda _: None)
    store = Store(f"sqlite:///{out / 'pool.db'}")
    try:
        sessions = store.list_sessions()  # by creation time: the start order
    finally:
        store.close()
    # group ids end in :gNNNNNN, the producer's launch order
    return [(int(s["group_id"].rsplit(":g", 1)[1]), s["sample_index"]) for s in sessions], rows


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["fifo", "seer"])
def test_start_order_follows_the_schedule(tmp_path: Path, schedule: str) -> None:
    order, rows = start_order(tmp_path, schedule)
    steps = [r for r in rows if r["phase"] == "train"]
    assert [r["step"] for r in steps] == [0]
    assert 0 <= steps[0]["in_flight"] <= 1 and steps[0]["queued"] >= 0  # --concurrency 1
    assert len(order) == len(set(order)), order  # every sample started once
    if schedule == "fifo":  # one group at a time, its samples in index order
        assert order[:6] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)], order
    else:  # the whole buffer launched; each group's probe before any group's other samples
        assert order[:4] == [(0, 0), (1, 0), (2, 0), (3, 0)], order
