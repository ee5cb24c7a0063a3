"""Stored rows → a session's History (after a restart) and its Trajectory (export)."""

from __future__ import annotations

import orjson

from envhub.gateway.history import History, TurnState
from envhub.gateway.pool import schema as t
from envhub.gateway.pool.store import Store
from envhub.gateway.render.messages import HASH_BYTES
from envhub.sdk.types import (
    CMAction,
    RewardEvent,
    Segment,
    SessionInfo,
    SessionStatus,
    Signal,
    ToolCall,
    Trajectory,
    Turn,
)


def _split(blob: bytes) -> list[bytes]:
    return [blob[i:i + HASH_BYTES] for i in range(0, len(blob), HASH_BYTES)]


def history_from_rows(rows: list[dict], cm_actions: list[dict] | None = None,
                      turn_info: list[dict] | None = None) -> History:
    """Rebuild the in-memory turn tree from stored turns (ordered by seq), the session's
    stored CM actions (they tie a turn that extends nothing to its conversation) and its turn
    facts (a side chain's link to the chain it copied)."""
    h = History()
    side_of = {e["seq"]: e["parent_chain"] for e in turn_info or []
               if e.get("parent_chain") is not None}
    actions = {e["seq"]: CMAction(**e) for e in cm_actions or [] if e.get("seq") is not None}
    for row in rows:
        parent = h.states.get(row["parent_seq"]) if row["parent_seq"] is not None else None
        state = TurnState(
            seq=row["seq"], segment=row["segment"], parent=parent,
            delta_ids=t.unpack_ids(row["prompt_delta"]),
            completion_ids=t.unpack_ids(row["completion"]),
            appended_hashes=_split(row["msg_hashes"]), response_hash=row["response_hash"],
            tools_key=row["tools_hash"], response_text=row.get("completion_text") or "",
        )
        if parent is not None and parent.segment == state.segment:
            parent.extended = True
        key = h.request_key(parent, state.tools_key, state.appended_hashes)
        h.add(state, key, 0, actions.get(state.seq), side_of.get(state.seq))
        h.next_seq = max(h.next_seq, state.seq + 1)
        h.next_segment = max(h.next_segment, state.segment + 1)
    return h


def session_info(row: dict) -> SessionInfo:
    return SessionInfo(
        id=row["id"], group_id=row["group_id"], task_id=row["task_id"], env=row["env"],
        sample_index=row["sample_index"], status=SessionStatus(row["status"]),
        reason=row["reason"], created_at=row["created_at"], closed_at=row["closed_at"],
        metadata=orjson.loads(row["metadata"] or "{}"),
    )


def build_trajectory(store: Store, session_row: dict) -> Trajectory:
    sid = session_row["id"]
    rows = store.turn_rows(sid)
    cm_actions = store.events("cm_actions", sid)
    turn_info = store.events("turn_info", sid)
    history = history_from_rows(rows, cm_actions, turn_info)
    turns: list[Turn] = []
    info = {e["seq"]: e for e in turn_info}
    segments: dict[int, dict[str, list]] = {}
    seg_chain: dict[int, int] = {}
    for row in rows:
        state = history.states[row["seq"]]
        logprobs = t.unpack_floats(row["logprobs"])
        calls = orjson.loads(row["tool_calls"]) if row["tool_calls"] else []
        turn = Turn(
            seq=row["seq"], segment=row["segment"], prompt_delta_ids=state.delta_ids,
            completion_ids=state.completion_ids, completion_logprobs=logprobs,
            weight_version=row["weight_version"], finish_reason=row["finish_reason"],
            tool_calls=[ToolCall(**c) for c in calls], latency_ms=row["latency_ms"],
            instance=row["instance"], trainable=row["trainable"], created_at=row["created_at"],
            prompt_ids=state.prompt_ids(), completion_text=row["completion_text"],
            requested_model=info.get(row["seq"], {}).get("requested_model"),
            forwards=info.get(row["seq"], {}).get("forwards"),
            chain=state.chain, parent_chain=history.side_of.get(state.chain),
        )
        turns.append(turn)
        seg = segments.setdefault(row["segment"], {"ids": [], "mask": [], "lp": [], "wv": [],
                                                   "seqs": []})
        seg_chain.setdefault(row["segment"], state.chain)
        n_delta, n_comp = len(turn.prompt_delta_ids), len(turn.completion_ids)
        sampled = 1 if turn.trainable else 0
        seg["ids"] += turn.prompt_delta_ids + turn.completion_ids
        seg["mask"] += [0] * n_delta + [sampled] * n_comp
        seg["lp"] += [0.0] * n_delta + logprobs
        seg["wv"] += [-1] * n_delta + [turn.weight_version] * n_comp
        seg["seqs"].append(turn.seq)
    return Trajectory(
        session=session_info(session_row),
        segments=[Segment(index=i, token_ids=s["ids"], loss_mask=s["mask"], logprobs=s["lp"],
                          weight_versions=s["wv"], turn_seqs=s["seqs"], chain=seg_chain[i])
                  for i, s in sorted(segments.items())],
        turns=turns,
        cm_actions=[CMAction(**e) for e in cm_actions],
        rewards=[RewardEvent(**e) for e in store.events("rewards", sid)],
        signals=[Signal(**e) for e in store.events("signals", sid)],
        status=SessionStatus(session_row["status"]),
    )
