"""Session leases: several gateway processes over one pool, each caching the histories it serves.

A process that loads a session's history from the pool first *claims* the session: it writes a
fresh random token into `session_leases`. Every turn it records afterwards carries a *guard*
in the same transaction: the row must still hold the token the history was loaded under, else
the transaction fails with `LeaseLost` and nothing is written. So when a session moves to
another process (a proxy's consistent hash after a process died, or came back) and then moves
back, the first process learns at its next write that its cached history is stale, and reloads.

The claim is committed before the history is read: a turn another process commits after the
claim fails its own guard, one committed before it is in what the claimer reads (PostgreSQL's
row lock on the lease and SQLite's single writer order the two).
"""

from __future__ import annotations

import secrets
import time

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from envhub.gateway.pool import schema as t
from envhub.gateway.pool.store import WriteOp, op_insert

__all__ = ["LeaseLost", "op_claim", "op_guard", "op_revoke", "new_token"]


class LeaseLost(Exception):
    """Another gateway process loaded this session after us: our cached history is stale."""


def new_token() -> str:
    return secrets.token_hex(8)


def op_claim(session_id: str, token: str, holder: str, *, new: bool = False) -> WriteOp:
    """Take the session for this process (an upsert; `new`: the session is created in the
    same transaction, so a plain insert)."""
    row = {"session_id": session_id, "token": token, "holder": holder, "taken_at": time.time()}
    if new:
        return op_insert("session_leases", row)

    def claim(conn: Connection) -> None:
        insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        stmt = insert(t.session_leases).values(**row)
        conn.execute(stmt.on_conflict_do_update(
            index_elements=[t.session_leases.c.session_id],
            set_={k: stmt.excluded[k] for k in ("token", "holder", "taken_at")}))

    return claim


# An UPDATE, not a SELECT: it locks the row until commit, so a concurrent claim waits for
# this write. Sent as driver SQL: it runs once per recorded turn, on the gateway's hot path,
# where SQLAlchemy's statement machinery cost more than SQLite's own work.
_GUARD = "UPDATE session_leases SET taken_at = taken_at WHERE session_id = {0} AND token = {0}"
_GUARD_SQL = {"qmark": _GUARD.format("?")}  # sqlite3
_GUARD_PG = _GUARD.format("%s")  # psycopg (paramstyle format/pyformat)


def op_guard(session_id: str, token: str) -> WriteOp:
    """Fail the transaction unless the session is still held under `token`."""
    params = (session_id, token)

    def guard(conn: Connection) -> None:
        sql = _GUARD_SQL.get(conn.dialect.paramstyle, _GUARD_PG)
        if conn.exec_driver_sql(sql, params).rowcount != 1:
            raise LeaseLost(session_id)

    return guard


def op_revoke(session_id: str) -> WriteOp:
    """Make every process's cached history of the session stale (e.g. the session was closed
    elsewhere: the process serving it must re-read its status)."""
    return lambda conn: conn.execute(
        update(t.session_leases).where(t.session_leases.c.session_id == session_id)
        .values(token=""))
