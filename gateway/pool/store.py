"""The data pool: SQLite (WAL) by default, PostgreSQL by URL, through SQLAlchemy Core.

Writes go through one writer thread that commits whatever is queued in a single transaction
(group commit): a request awaits its write's commit before its response is returned, and
concurrent requests share one fsync.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import create_engine, event, func, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from envhub.gateway.pool import schema as t


@dataclass(frozen=True)
class Insert:
    """A row to insert. Inserts of a batch are grouped per table into one executemany with a
    prepared statement: building a statement per row cost more than SQLite's own work."""

    table: str
    row: dict[str, Any]


WriteOp = Callable[[Connection], Any] | Insert
_MAX_BATCH = 512


def _engine_for(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            # WAL + synchronous=NORMAL: a committed transaction survives a process crash
            # (kill -9); only an OS crash could lose the last commits.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return create_engine(url, pool_size=8, max_overflow=16, pool_pre_ping=True)


class Store:
    def __init__(self, url: str):
        self.url = url
        self.engine = _engine_for(url)
        t.metadata.create_all(self.engine)
        self._queue: queue.Queue[tuple[list[WriteOp], asyncio.AbstractEventLoop,
                                       asyncio.Future] | None] = queue.Queue()
        self._conn: Connection | None = None  # the writer thread's own, kept between batches
        self._writer = threading.Thread(target=self._write_loop, name="pool-writer", daemon=True)
        self._writer.start()

    # -- writes --------------------------------------------------------------------------------

    async def write(self, *ops: WriteOp) -> None:
        """Run `ops` in one transaction (grouped with other pending writes); wait for commit."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._queue.put((list(ops), loop, fut))
        return await fut

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                if self._conn is not None:
                    self._conn.close()
                return
            batch = [item]
            while len(batch) < _MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            self._commit(batch)

    def _transaction(self, ops: list[WriteOp]) -> None:
        """`ops` in one transaction on the writer's connection, which stays open between
        batches (a pool checkout and its reset per batch cost about as much as a turn's insert).
        A connection the database dropped (a restarted server) is replaced once."""
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = self.engine.connect()
            try:
                with self._conn.begin():
                    _run(self._conn, ops)
                return
            except Exception as e:
                lost = isinstance(e, DBAPIError) and e.connection_invalidated
                if lost or self._conn.invalidated:
                    self._conn.close()
                    self._conn = None
                if attempt == 2 or not lost:
                    raise

    def _commit(self, batch: list) -> None:
        try:
            self._transaction([op for ops, _, _ in batch for op in ops])
            for _, loop, fut in batch:
                loop.call_soon_threadsafe(_resolve, fut, None, None)
        except Exception as e:  # one bad write must not fail its neighbours: retry one by one
            if len(batch) == 1:
                _, loop, fut = batch[0]
                loop.call_soon_threadsafe(_resolve, fut, None, e)
                return
            for one in batch:
                self._commit([one])

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join(timeout=30)
        self.engine.dispose()

    # -- reads (blocking; call through asyncio.to_thread on the server) ------------------------

    def session_row(self, session_id: str) -> dict | None:
        with self.engine.connect() as c:
            row = c.execute(select(t.sessions).where(t.sessions.c.id == session_id)).first()
        return dict(row._mapping) if row else None

    def session_by_key(self, key_hash: str) -> dict | None:
        with self.engine.connect() as c:
            row = c.execute(select(t.sessions).where(t.sessions.c.key_hash == key_hash)).first()
        return dict(row._mapping) if row else None

    def list_sessions(self, group_id: str | None = None, status: str | None = None,
                      limit: int = 1000, offset: int = 0) -> list[dict]:
        q = select(t.sessions).order_by(t.sessions.c.created_at, t.sessions.c.id)
        if group_id is not None:
            q = q.where(t.sessions.c.group_id == group_id)
        if status is not None:
            q = q.where(t.sessions.c.status == status)
        with self.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(q.limit(limit).offset(offset))]

    def turn_rows(self, session_id: str) -> list[dict]:
        q = select(t.turns).where(t.turns.c.session_id == session_id).order_by(t.turns.c.seq)
        with self.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(q)]

    def events(self, table_name: str, session_id: str) -> list[dict]:
        table = {"cm_actions": t.cm_actions, "rewards": t.rewards, "signals": t.signals,
                 "turn_info": t.turn_info}[table_name]
        q = select(table.c.body).where(table.c.session_id == session_id).order_by(table.c.id)
        with self.engine.connect() as c:
            return [orjson.loads(r[0]) for r in c.execute(q)]

    def response_row(self, response_id: str) -> dict | None:
        with self.engine.connect() as c:
            row = c.execute(select(t.responses).where(t.responses.c.id == response_id)).first()
        return dict(row._mapping) if row else None

    def latest_response_id(self, session_id: str) -> str | None:
        q = (select(t.responses.c.id).where(t.responses.c.session_id == session_id)
             .order_by(t.responses.c.created_at.desc()).limit(1))
        with self.engine.connect() as c:
            return c.execute(q).scalar()

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as c:
            return {
                "sessions": c.execute(select(func.count()).select_from(t.sessions)).scalar_one(),
                "turns": c.execute(select(func.count()).select_from(t.turns)).scalar_one(),
            }


def _run(conn: Connection, ops: list[WriteOp]) -> None:
    """Execute ops in order; runs of inserts into one table become one executemany."""
    i = 0
    while i < len(ops):
        op = ops[i]
        if not isinstance(op, Insert):
            op(conn)
            i += 1
            continue
        rows: dict[str, list[dict[str, Any]]] = {}  # table → rows of the run of inserts
        while i < len(ops) and isinstance(insert := ops[i], Insert):
            rows.setdefault(insert.table, []).append(insert.row)
            i += 1
        for table, batch in rows.items():
            conn.execute(_INSERTS[table], batch)


_INSERTS = {name: table.insert() for name, table in t.metadata.tables.items()}


def _resolve(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


# -- write ops (closures run inside the writer's transaction) ----------------------------------

def op_insert(table_name: str, row: dict) -> WriteOp:
    assert table_name in _INSERTS, table_name
    return Insert(table_name, row)


def op_event(table_name: str, session_id: str, body: dict) -> WriteOp:
    return op_insert(table_name, {"session_id": session_id, "body": orjson.dumps(body).decode()})


def op_update_session(session_id: str, **values: Any) -> WriteOp:
    return lambda conn: conn.execute(
        update(t.sessions).where(t.sessions.c.id == session_id).values(**values))


def op_delete_response(response_id: str) -> WriteOp:
    """A tombstone: later responses that link to it still read its items."""
    return lambda conn: conn.execute(
        update(t.responses).where(t.responses.c.id == response_id).values(deleted=True))


__all__ = ["IntegrityError", "Store", "op_event", "op_insert", "op_update_session"]
