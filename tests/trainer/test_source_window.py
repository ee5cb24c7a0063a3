"""Windowed-FIFO choice of groups (in memory; against a real gateway: test_sources_real_gateway)."""

from __future__ import annotations

import pytest

from envhub.sdk.types import SessionStatus
from envhub.trainer.errors import SourceError
from envhub.trainer.source import HttpSource, InMemorySource
from envhub.trainer.window import GroupWindow
from tests.trainer.handmade import trajectory


def _pool(finished: dict[str, bool]) -> list:
    """Groups g0, g1, ... started in that order; an unfinished group has one open session."""
    out = []
    for n, (gid, done) in enumerate(finished.items()):
        for i in range(2):
            status = "open" if (not done and i == 1) else "done"
            out.append(trajectory(f"{gid}-{i}", gid, index=i, status=status,
                                  created_at=10.0 * n + i))
    return out


def test_strict_fifo_waits_for_the_head() -> None:
    source = InMemorySource(_pool({"g0": False, "g1": True, "g2": True}))
    window = GroupWindow(source, window=1)
    assert window.take(2) == []  # g0 is still running; W=1 does not look past it


def test_window_admits_finished_groups_behind_a_slow_head() -> None:
    pool = _pool({"g0": False, "g1": True, "g2": True, "g3": True})
    source = InMemorySource(pool)
    window = GroupWindow(source, window=3)
    assert [g.group_id for g in window.take(5)] == ["g1", "g2"]  # g3 is outside [g0, g1, g2]
    # The head has not moved, so g3 is still out of reach ...
    assert window.take(1) == []
    # ... until g0 finishes and is consumed: then the window slides over g3.
    for t in pool:
        if t.session.id == "g0-1":
            t.status = SessionStatus.done
    assert [g.group_id for g in window.take(5)] == ["g0", "g3"]


def test_greedy_window_takes_any_finished_group() -> None:
    source = InMemorySource(_pool({"g0": False, "g1": True, "g2": True, "g3": True}))
    assert [g.group_id for g in GroupWindow(source, None).take(9)] == ["g1", "g2", "g3"]


def test_groups_are_ordered_by_start_time_not_name() -> None:
    pool = _pool({"zeta": True, "alpha": True})  # zeta started first
    assert [g.group_id for g in GroupWindow(InMemorySource(pool), 1).take(2)] == ["zeta", "alpha"]


def test_unreachable_gateway_says_what_to_check() -> None:
    from tests.support import free_port

    with HttpSource(f"http://127.0.0.1:{free_port()}", timeout=2) as source, \
            pytest.raises(SourceError, match="cannot reach the gateway"):
        source.list_groups()


def test_jsonl_source_reports_the_bad_line(tmp_path) -> None:
    path = tmp_path / "pool.jsonl"
    path.write_text(trajectory("a").model_dump_json() + "\n{not json\n")
    with pytest.raises(SourceError, match=r"pool.jsonl:2"):
        InMemorySource.from_jsonl(path)
