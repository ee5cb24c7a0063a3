"""`envhub run --schedule`: the order rollouts start in, read back from the pool (sessions are
opened as rollouts start). FIFO runs a group's samples back to back; Seer starts one probe per
group first. The CLI refuses an unknown policy with exit 2."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from envhub.orchestrator.groups import EnvChoice, RunConfig, run
from tests.support import envhub


def start_order(schedule: str, out: Path) -> list[tuple[str, int]]:
    from envhub.gateway.pool.store import Store

    outcome = asyncio.run(run(RunConfig(envs=[EnvChoice.parse("arith")], agent="oracle",
                                        model="zero", n=3, k=3, concurrency=1, out=out,
                                        schedule=schedule), progress=False))
    assert [r.status for r in outcome.records] == ["done"] * 9
    store = Store(f"sqlite:///{out / 'pool.db'}")
    try:
        return [(s["task_id"], s["sample_index"]) for s in store.list_sessions()]
    finally:
        store.close()


@pytest.mark.parametrize("schedule", ["fifo", "seer"])
def test_start_order_follows_the_policy(schedule: str, tmp_path: Path) -> None:
    order = start_order(schedule, tmp_path / schedule)
    tasks = list(dict.fromkeys(t for t, _ in order))
    assert len(tasks) == 3 and sorted(order) == sorted((t, i) for t in tasks for i in range(3))
    if schedule == "fifo":
        assert order == [(t, i) for t in tasks for i in range(3)]
    else:  # one probe (sample 0) per group, in plan order, before any group's rest
        assert order[:3] == [(t, 0) for t in tasks]


def test_unknown_schedule_exits_2_with_the_choices(tmp_path: Path) -> None:
    r = envhub("run", "arith", "--agent", "oracle", "--schedule", "lifo", "--out",
               str(tmp_path / "out"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "fifo, seer" in r.stderr
    assert not (tmp_path / "out").exists()


def test_unknown_executor_exits_2_before_anything_is_kept(tmp_path: Path) -> None:
    r = envhub("run", "arith", "--agent", "oracle", "--executor", "nosuch", "--out",
               str(tmp_path / "out"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "inprocess, ray" in r.stderr
    assert not (tmp_path / "out").exists()
