"""The data pool: SQLite (WAL) by default, PostgreSQL by URL, through SQLAlchemy Core.

Writes are grouped (group commit): every write pending at one moment commits in a single
transaction, and a request awaits its write's commit before its response is returned.
- PostgreSQL: one writer thread commits whatever is queued (the round trip to the server
  releases the GIL: the event loop runs meanwhile).
- SQLite: the event loop commits what its requests wrote during one of its iterations, on its
  own thread. SQLite's work is a few tens of microseconds a turn, most of it Python holding the
  GIL; done on a second thread it made both threads wait for the GIL at every SQLite call
  (a batch of 22 turns took 8.6 ms, and 1,000 sessions saw 300 ms gateway p99s), and at
  concurrency 1 the two thread wake-ups were a third of what the gateway adds to a call. It
  never waits there on another process's lock: a busy database, like any failed batch, goes to
  the writer thread, which waits, and retries a failed batch one write at a time so that one
  bad write fails alone. Checkpoints (copying the WAL back into the database, with an fsync)
  are off the loop: SQLite's automatic one runs inside the commit that crosses 1,000 pages and
  held the loop 5-20 ms about once a second at 800 calls/s; a checkpointer thread with its own
  connection runs a PASSIVE one (never blocking a writer) each CHECKPOINT_EVERY_S instead.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from sqlalchemy import create_engine, event, func, select, update
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.sql.schema import ScalarElementColumnDefault

from envhub.gateway.pool import schema as t


@dataclass(frozen=True)
class Insert:
    """A row to insert. Inserts of a batch are grouped per table into one executemany with a
    prepared statement: building a statement per row cost more than SQLite's own work."""

    table: str
    row: dict[str, Any]


class PoolUnavailable(Exception):
    """The pool cannot record or read right now, through no fault of the request (`reason`:
    its disk is full, its database unreachable): the server answers 503 with Retry-After and
    reports not ready on /health until a write succeeds again."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fault_reason(exc: BaseException) -> str | None:
    """Why the pool failed `exc`'s operation when the pool itself is at fault (its storage or
    its server), else None (a write's own error, e.g. a duplicate key, a missing table, or a
    bug: those stay 500s)."""
    if isinstance(exc, PoolUnavailable):
        return exc.reason
    if isinstance(exc, PoolTimeout):  # every connection of the engine's pool in use
        return "the pool's database has no free connection (its server is slow or stuck)"
    if not isinstance(exc, DBAPIError) or isinstance(exc, IntegrityError):
        return None
    text = str(getattr(exc, "orig", exc)).lower()
    if any(word in text for word in _FULL):
        return "the pool's disk is full"
    if any(word in text for word in _STORAGE):
        return "the pool's storage failed (disk I/O error, or it became read-only)"
    if "database is locked" in text:  # SQLite, past its busy timeout
        return "the pool's database is locked by another writer"
    if exc.connection_invalidated or (isinstance(exc, OperationalError | InterfaceError)
                                      and any(word in text for word in _UNREACHABLE)):
        return "the pool's database is unreachable"
    return None


# what the drivers say (sqlite3, psycopg) of a full disk, failed storage, a server gone
_FULL = ("database or disk is full", "no space left", "disk quota", "could not extend file")
_STORAGE = ("disk i/o error", "attempt to write a readonly database", "read-only file system",
            "unable to open database file")
_UNREACHABLE = ("connection", "connect to server", "server closed", "terminating",
                "shutting down", "starting up", "in recovery mode", "the database system is")


WriteOp = Callable[[Connection], Any] | Insert
_Write = tuple[list[WriteOp], asyncio.AbstractEventLoop, asyncio.Future]  # ops, whose, result
_MAX_BATCH = 512
_R = TypeVar("_R")
_BUSY_TIMEOUT_MS = 30_000  # how long a SQLite writer waits for another process's write lock
CHECKPOINT_EVERY_S = 1.0  # SQLite: how often the checkpointer copies the WAL back, if written
# A WAL restarts from its start only when a write begins after a complete checkpoint; past this
# many pages (64 MiB of 4 KiB pages) the checkpointer forces one (TRUNCATE: writers meanwhile
# find the database busy, and the loop hands its batches to the writer thread, which waits)
WAL_RESTART_PAGES = 16_384


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
            cur.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA wal_autocheckpoint=0")  # the Store's checkpointer does it
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
        self._queue: queue.Queue[_Write | None] = queue.Queue()
        self._conn: Connection | None = None  # the writer's, kept between batches
        self._conn_lock = threading.Lock()  # held by whoever commits on `_conn`
        self._on_loop = url.startswith("sqlite")  # SQLite: commits on the event loop
        # per event loop, the writes of its current iteration (only that loop's thread)
        self._pending: dict[asyncio.AbstractEventLoop, list[_Write]] = {}
        self._writer = threading.Thread(target=self._write_loop, name="pool-writer", daemon=True)
        self._writer.start()
        self._commits = 0  # SQLite: transactions committed, for the checkpointer
        self.fault: str | None = None  # why the last write failed, if the pool is at fault
        # per event loop, the write probe under way (/health while the pool is failing)
        self._probing: dict[asyncio.AbstractEventLoop, asyncio.Task[str | None]] = {}
        self._closing = threading.Event()
        self._checkpointer: threading.Thread | None = None
        if url.startswith("sqlite"):
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, daemon=True,
                                                  name="pool-checkpointer")
            self._checkpointer.start()

    # -- writes --------------------------------------------------------------------------------

    async def write(self, *ops: WriteOp) -> None:
        """Run `ops` in one transaction (grouped with other pending writes); wait for commit."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        if self._on_loop:
            pending = self._pending.get(loop)
            if pending is None:  # the first write of this iteration: flush once it is over
                self._pending[loop] = pending = []
                loop.call_soon(self._flush_here, loop)
            pending.append((list(ops), loop, fut))
        else:
            self._queue.put((list(ops), loop, fut))
        try:
            result = await fut
        except Exception as e:
            self._failed(e)
            raise
        self.fault = None
        return result

    def _failed(self, exc: BaseException) -> None:
        """Remember a fault of the pool's own (/health reports it until a write succeeds) and
        raise it as PoolUnavailable; any other error is left to the caller."""
        reason = fault_reason(exc)
        if reason is not None:
            self.fault = reason
            raise PoolUnavailable(reason) from exc

    async def probe(self) -> str | None:
        """Whether the pool can write now (None) or why not: a probe row of PROBE_BYTES written
        and removed again in one transaction, grouped like any write. At most one probe runs
        at a time per event loop; callers on that loop meanwhile share its answer."""
        loop = asyncio.get_running_loop()
        running = self._probing.get(loop)
        if running is None:
            running = self._probing[loop] = loop.create_task(self._probe_once())
            running.add_done_callback(lambda _: self._probing.pop(loop, None))
        return await asyncio.shield(running)

    async def _probe_once(self) -> str | None:
        try:
            await self.write(_probe_write)
        except PoolUnavailable as e:
            return e.reason
        except Exception as e:  # noqa: BLE001  a probe that fails otherwise still says so
            return f"the pool cannot write ({type(e).__name__})"
        return None

    async def read(self, fn: Callable[..., _R], *args: Any) -> _R:
        """`fn(*args)`, one of the reads below: on SQLite right here (an indexed read takes
        tens of microseconds, less than a thread hop, and a WAL reader never waits for a
        writer), on PostgreSQL on a thread (a round trip to the server)."""
        try:
            if self._on_loop:
                return fn(*args)
            return await asyncio.to_thread(fn, *args)
        except Exception as e:
            self._failed(e)
            raise

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                with self._conn_lock:
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
            conn = self._connection()
            try:
                with conn.begin():
                    _run(conn, ops)
                self._commits += 1
                return
            except Exception as e:
                lost = isinstance(e, DBAPIError) and e.connection_invalidated
                if lost or conn.invalidated:
                    conn.close()
                    self._conn = None
                if attempt == 2 or not lost:
                    raise

    def _connection(self) -> Connection:
        """The writer's connection (whoever holds `_conn_lock`), opened when first needed."""
        if self._conn is None:
            self._conn = self.engine.connect()
            if self._on_loop:  # the loop's commits never wait; the writer's set it around theirs
                self._busy_timeout(0)
        return self._conn

    def _flush_here(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commit the writes `loop` gathered, on its thread (SQLite): one transaction that
        never waits for another process's lock. Busy, failed, or with the writer thread at
        work or holding writes (they stay in order), the batch goes to the writer thread."""
        batch = self._pending.pop(loop)
        if not self._queue.empty() or not self._conn_lock.acquire(blocking=False):
            return self._hand_over(batch)
        try:
            self._transaction([op for ops, _, _ in batch for op in ops])
        except Exception:  # rolled back: the writer retries it, one write at a time if need be
            return self._hand_over(batch)
        finally:
            self._conn_lock.release()
        for _, _, fut in batch:
            _resolve(fut, None, None)

    def _hand_over(self, batch: list[_Write]) -> None:
        for item in batch:
            self._queue.put(item)

    def _busy_timeout(self, ms: int) -> None:
        """How long the writer's SQLite connection waits for another process's write lock."""
        assert self._conn is not None
        sqlite = self._conn.connection.driver_connection
        assert sqlite is not None
        sqlite.execute(f"PRAGMA busy_timeout={ms}")

    def _commit(self, batch: list) -> None:
        try:
            with self._conn_lock:
                if self._on_loop:
                    self._connection()
                    self._busy_timeout(_BUSY_TIMEOUT_MS)
                try:
                    self._transaction([op for ops, _, _ in batch for op in ops])
                finally:
                    if self._on_loop and self._conn is not None:
                        self._busy_timeout(0)
            for _, loop, fut in batch:
                loop.call_soon_threadsafe(_resolve, fut, None, None)
        except Exception as e:  # one bad write must not fail its neighbours: retry one by one
            if len(batch) == 1:
                _, loop, fut = batch[0]
                loop.call_soon_threadsafe(_resolve, fut, None, e)
                return
            for one in batch:
                self._commit([one])

    def _checkpoint_loop(self) -> None:
        """SQLite: a PASSIVE checkpoint every CHECKPOINT_EVERY_S when anything was committed,
        on a connection of its own (SQLite runs it without holding the GIL, and it copies what
        it can without waiting for, or blocking, a writer or reader)."""
        done = 0
        raw = self.engine.raw_connection()
        try:
            sqlite = raw.driver_connection
            assert sqlite is not None
            while not self._closing.wait(CHECKPOINT_EVERY_S):
                if self._commits != done:
                    done = self._commits
                    _, wal_pages, _ = sqlite.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if wal_pages > WAL_RESTART_PAGES:
                        sqlite.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            raw.close()

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join(timeout=30)
        self._closing.set()
        if self._checkpointer is not None:
            self._checkpointer.join(timeout=30)
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


PROBE_BYTES = 64 << 10  # about a long turn's token arrays: a disk that takes it takes turns


def _probe_write(conn: Connection) -> None:
    probe = secrets.token_hex(8)  # its own row: gateways sharing a pool probe side by side
    conn.execute(t.pool_probe.insert().values(id=probe, body=b"\0" * PROBE_BYTES))
    conn.execute(t.pool_probe.delete().where(t.pool_probe.c.id == probe))


def _run(conn: Connection, ops: list[WriteOp]) -> None:
    """Execute ops in order; runs of inserts into one table become one executemany."""
    i = 0
    while i < len(ops):
        op = ops[i]
        if not isinstance(op, Insert):
            op(conn)
            i += 1
            continue
        # (table, columns) → rows, for the run of inserts
        rows: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}
        while i < len(ops) and isinstance(insert := ops[i], Insert):
            rows.setdefault((insert.table, tuple(insert.row)), []).append(insert.row)
            i += 1
        for (table, columns), batch in rows.items():
            sql, order, defaults = _insert_sql(conn.dialect, table, columns)
            if defaults:
                batch = [{**defaults, **row} for row in batch]
            conn.exec_driver_sql(sql, [tuple(row[k] for k in order) for row in batch]
                                 if order is not None else batch)


@functools.lru_cache(maxsize=256)
def _insert_sql(dialect: Dialect, table_name: str, columns: tuple[str, ...]
                ) -> tuple[str, tuple[str, ...] | None, dict[str, Any]]:
    """The INSERT of these columns in the dialect's own SQL, compiled once: the statement, the
    parameter order of a positional dialect (else None: named parameters), and the scalar
    defaults of the columns not given. Executed as driver SQL, a turn's insert skips the
    statement cache lookup and per-value processing that cost more than SQLite's own work
    (the pool's columns are plain numbers, strings and bytes, which every driver takes as is)."""
    table = t.metadata.tables[table_name]
    defaults = {c.key: c.default.arg for c in table.columns if c.key not in columns
                and isinstance(c.default, ScalarElementColumnDefault)}
    compiled = table.insert().compile(dialect=dialect, column_keys=[*columns, *defaults])
    order = tuple(compiled.positiontup or ()) if compiled.positional else None
    return str(compiled), order, defaults


def _resolve(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


# -- write ops (closures run inside the writer's transaction) ----------------------------------

def op_insert(table_name: str, row: dict) -> WriteOp:
    assert table_name in t.metadata.tables, table_name
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
