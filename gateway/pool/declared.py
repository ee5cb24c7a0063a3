"""Declared context actions in the pool, so any gateway process sharing it applies them.

An agent declares a context action (the SDK's `context_action`) for its *next* request, and
that request may land on another gateway process (a proxy spreading sessions). The
declaration is written to `cm_declared` with an id, also put in the action's
`info["declaration"]`; it is used up once a recorded cm_actions event carries that id (the
event is written with the turn it labels), so a row needs no deletion and a call that failed
leaves it pending.

- The process holding the session's lease (pool/leases.py) also keeps the declaration in its
  cached history: no extra work on the common path.
- Any other process revokes the lease in the same transaction: the holder's next write fails
  its guard (that sample is discarded and re-run, as on any lease loss), the holder reloads
  the history from the pool, and the reload picks the declaration up (`pending`).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from envhub.gateway.pool import schema as t
from envhub.gateway.pool.store import Store

__all__ = ["Declaration", "pending"]


class Declaration:
    """One declaration: `op` is its write (run it with `Store.write`); after the commit,
    `held` says whether the declaring process held the session's lease `lease` (then its
    cached history must apply `body` itself: nobody reloads)."""

    def __init__(self, session_id: str, body: dict[str, Any], lease: str | None):
        self.id = secrets.token_hex(8)
        self.session_id, self.lease = session_id, lease
        self.body = {**body, "info": {**body.get("info", {}), "declaration": self.id}}
        self.held = False

    def op(self, conn: Connection) -> None:
        sid, leases = self.session_id, t.session_leases
        # a no-op UPDATE: true iff our lease is current (and it locks the row until commit)
        self.held = self.lease is not None and conn.execute(
            update(leases).where(leases.c.session_id == sid, leases.c.token == self.lease)
            .values(token=self.lease)).rowcount == 1
        if not self.held:  # whoever holds the session must reload it (module docstring)
            conn.execute(update(leases).where(leases.c.session_id == sid).values(token=""))
        row = {"session_id": sid, "id": self.id, "body": orjson.dumps(self.body).decode(),
               "declared_at": time.time()}
        insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        stmt = insert(t.cm_declared).values(**row)
        conn.execute(stmt.on_conflict_do_update(
            index_elements=[t.cm_declared.c.session_id],
            set_={k: stmt.excluded[k] for k in ("id", "body", "declared_at")}))


def pending(store: Store, session_id: str, recorded: list[dict[str, Any]]
            ) -> dict[str, Any] | None:
    """The session's declared action (a CMAction body) unless one of its `recorded`
    cm_actions events used it up; blocking: call through Store.read."""
    q = select(t.cm_declared.c.id, t.cm_declared.c.body).where(
        t.cm_declared.c.session_id == session_id)
    with store.engine.connect() as c:
        row = c.execute(q).first()
    if row is None or any((e.get("info") or {}).get("declaration") == row.id
                          for e in recorded):
        return None
    body: dict[str, Any] = orjson.loads(row.body)
    return body
