"""Trajectory export from the pool: JSONL (one Trajectory per line) and flat Parquet (one row
per segment, arrays as list columns, session fields and the composite reward beside them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson

from envhub.gateway.pool.store import Store
from envhub.gateway.pool.trajectory import build_trajectory
from envhub.sdk.types import Trajectory


def trajectories(store: Store, group_id: str | None = None,
                 status: str | None = None) -> Iterator[Trajectory]:
    offset = 0
    while True:
        rows = store.list_sessions(group_id, status, limit=500, offset=offset)
        if not rows:
            return
        for row in rows:
            yield build_trajectory(store, row)
        offset += len(rows)


def export_jsonl(store: Store, out: Path, group_id: str | None = None,
                 status: str | None = None) -> int:
    n = 0
    tmp = out.with_name(out.name + ".part")  # no half-written file on failure
    with open(tmp, "wb") as f:
        for t in trajectories(store, group_id, status):
            f.write(orjson.dumps(t.model_dump(mode="json")) + b"\n")
            n += 1
    tmp.replace(out)
    return n


def export_parquet(store: Store, out: Path, group_id: str | None = None,
                   status: str | None = None) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for t in trajectories(store, group_id, status):
        for seg in t.segments:
            rows.append({
                "session_id": t.session.id, "group_id": t.session.group_id,
                "task_id": t.session.task_id, "env": t.session.env,
                "sample_index": t.session.sample_index, "status": t.status.value,
                "segment": seg.index, "token_ids": seg.token_ids, "loss_mask": seg.loss_mask,
                "logprobs": seg.logprobs, "weight_versions": seg.weight_versions,
                "turn_seqs": seg.turn_seqs, "reward": t.total_reward(),
                "rewards": orjson.dumps([r.model_dump() for r in t.rewards]).decode(),
                "cm_actions": orjson.dumps([a.model_dump() for a in t.cm_actions]).decode(),
            })
    tmp = out.with_name(out.name + ".part")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(out)
    return len(rows)
