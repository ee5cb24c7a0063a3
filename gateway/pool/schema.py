"""Pool tables (SQLAlchemy Core). Token arrays are stored as packed little-endian blobs:
int32 ids (4 bytes/token) and float32 logprobs (4 bytes/sampled token); turns store deltas, so
stored bytes grow with unique tokens, not with turns²."""

from __future__ import annotations

from array import array

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

sessions = Table(
    "sessions", metadata,
    Column("id", String(128), primary_key=True),
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("group_id", String(256), index=True),
    Column("task_id", String(256)),
    Column("env", String(256)),
    Column("sample_index", Integer, nullable=False, default=0),
    Column("status", String(16), nullable=False, default="open", index=True),
    Column("reason", Text),
    Column("created_at", Float, nullable=False),
    Column("closed_at", Float),
    Column("metadata", Text, nullable=False, default="{}"),
)

# /health's write probe while the pool is failing (store.Store.probe): a row written and
# removed in one transaction, so the table stays empty
pool_probe = Table(
    "pool_probe", metadata,
    Column("id", String(16), primary_key=True),
    Column("body", LargeBinary, nullable=False),
)

turns = Table(
    "turns", metadata,
    Column("session_id", String(128), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("segment", Integer, nullable=False),
    Column("parent_seq", Integer),  # the turn whose history this prompt extends
    Column("prompt_delta", LargeBinary, nullable=False),  # int32[]
    Column("completion", LargeBinary, nullable=False),  # int32[]
    Column("logprobs", LargeBinary, nullable=False),  # float32[]
    Column("weight_version", Integer, nullable=False),
    Column("finish_reason", String(16), nullable=False),
    Column("tool_calls", Text),  # JSON or NULL
    Column("msg_hashes", LargeBinary, nullable=False),  # 8 bytes per appended message
    Column("response_hash", LargeBinary, nullable=False),
    Column("tools_hash", LargeBinary, nullable=False),
    Column("latency_ms", Float, nullable=False),
    Column("instance", String(256), nullable=False, default=""),
    Column("trainable", Boolean, nullable=False, default=True),
    Column("completion_text", Text),  # text-only backends
    Column("created_at", Float, nullable=False),
)


def _events(name: str, index: str) -> Table:
    """An append-only event table: one JSON body per row, read back per session in order."""
    return Table(
        name, metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("session_id", String(128), nullable=False),
        Column("body", Text, nullable=False),
        Index(index, "session_id"),
    )


cm_actions = _events("cm_actions", "ix_cm_session")  # bodies: CMAction JSON
rewards = _events("rewards", "ix_rewards_session")  # RewardEvent JSON
signals = _events("signals", "ix_signals_session")  # Signal JSON
# Per-turn facts added after the `turns` table shipped: {"seq", "requested_model"}. A table
# of its own because create_all adds missing tables to an existing pool (SQLite or
# PostgreSQL) but never columns, and there is no migration step.
turn_info = _events("turn_info", "ix_turn_info_session")

# Responses API objects (/v1/responses with store: true), so that `previous_response_id` and
# GET /v1/responses/{id} survive a gateway restart. Storage grows with unique items, not with
# turns²: a response stores only the input items after its `previous_id` link (the explicit
# previous_response_id, or the session's previous response when the client resent that
# conversation whole); its conversation is the walk of links, input then output of each.
responses = Table(
    "responses", metadata,
    Column("id", String(64), primary_key=True),
    Column("session_id", String(128), nullable=False, index=True),
    Column("previous_id", String(64)),  # the link whose conversation precedes `input`
    Column("body", Text, nullable=False),  # the response object, JSON
    Column("input", Text, nullable=False),  # input items after the link's conversation, JSON
    Column("deleted", Boolean, nullable=False, default=False),  # kept for later links
    Column("created_at", Float, nullable=False),
)

# Which gateway process may record turns of a session (gateway/pool/leases.py): several
# gateway processes share one pool and each caches the histories it serves; `token` changes
# whenever a process (re)loads a session, so a process whose cached history is stale finds
# out when it writes. A table of its own for the same reason as turn_info.
session_leases = Table(
    "session_leases", metadata,
    Column("session_id", String(128), primary_key=True),
    Column("token", String(32), nullable=False),
    Column("holder", String(256), nullable=False),  # the gateway process (x-envhub-gateway)
    Column("taken_at", Float, nullable=False),
)

# A context action the agent declared (the SDK's `context_action`) for its next request, so
# that whichever gateway process on this pool serves that request applies it
# (gateway/pool/declared.py). One row per session: a new declaration replaces the last. It is
# used up once a cm_actions event carries its id (`info.declaration`); rows are never deleted.
cm_declared = Table(
    "cm_declared", metadata,
    Column("session_id", String(128), primary_key=True),
    Column("id", String(32), nullable=False),
    Column("body", Text, nullable=False),  # CMAction JSON, `info.declaration` = id
    Column("declared_at", Float, nullable=False),
)


def pack_ids(ids: list[int]) -> bytes:
    return array("i", ids).tobytes()


def unpack_ids(blob: bytes) -> list[int]:
    a = array("i")
    a.frombytes(blob)
    return a.tolist()


def pack_floats(xs: list[float]) -> bytes:
    return array("f", xs).tobytes()


def unpack_floats(blob: bytes) -> list[float]:
    a = array("f")
    a.frombytes(blob)
    return a.tolist()
