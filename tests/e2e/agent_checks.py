"""Checks shared by the tests that run real third-party agents inside the sandbox: the rollout's
record, its trajectory read back from the run's pool, and the token-exact invariants."""

from __future__ import annotations

import json
from pathlib import Path

from envhub.sdk.types import Trajectory


def only_rollout(out: Path) -> dict:
    """The one rollout record a `-n 1 -k 1` run wrote to `out`."""
    records = [json.loads(p.read_text()) for p in (out / "rollouts").iterdir()]
    assert len(records) == 1, records
    return records[0]


def pool_trajectory(out: Path, session_id: str) -> Trajectory:
    """The session's trajectory as the run's pool (out/pool.db) holds it."""
    from envhub.gateway.pool.store import Store
    from envhub.gateway.pool.trajectory import build_trajectory

    store = Store(f"sqlite:///{out / 'pool.db'}")
    try:
        row = store.session_row(session_id)
        assert row is not None, session_id
        return build_trajectory(store, row)
    finally:
        store.close()


def assert_token_exact(traj: Trajectory) -> None:
    """Every turn has ids and one logprob per completion id, and inside each segment (TITO) a
    turn's prompt is the previous turn's prompt + completion + its own delta; a segment's first
    turn's delta is its whole prompt."""
    by_segment: dict[int, list] = {}
    for turn in traj.turns:
        assert turn.prompt_ids and turn.completion_ids, turn.seq
        assert len(turn.completion_logprobs) == len(turn.completion_ids), turn.seq
        by_segment.setdefault(turn.segment, []).append(turn)
    for turns in by_segment.values():
        turns.sort(key=lambda t: t.seq)
        assert turns[0].prompt_ids == turns[0].prompt_delta_ids, turns[0].seq
        assert len({t.chain for t in turns}) == 1, [t.seq for t in turns]  # a segment, a chain
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur.prompt_ids == prev.prompt_ids + prev.completion_ids + cur.prompt_delta_ids, \
                cur.seq
