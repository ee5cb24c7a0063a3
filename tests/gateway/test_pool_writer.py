"""The pool's writer: a lone call's turn commits on the caller's thread when the writer is idle,
never waiting there for another process's lock; everything else goes through the writer."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

from sqlalchemy import event, select

from envhub.gateway.pool import schema as t
from envhub.gateway.pool.rows import session_insert
from envhub.gateway.pool.store import Store


def _session(i: int):
    return session_insert(f"s{i}", f"k{i}", group_id=None, task_id=None, env=None,
                          sample_index=0, metadata=None)


def _committers(store: Store) -> list[str]:
    names: list[str] = []
    event.listen(store.engine, "commit", lambda conn: names.append(
        threading.current_thread().name))
    return names


def _ids(store: Store) -> set[str]:
    with store.engine.connect() as c:
        return {r[0] for r in c.execute(select(t.sessions.c.id))}


def test_a_lone_write_commits_on_the_callers_thread_others_on_the_writer(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/pool.db")
    committers = _committers(store)
    try:
        asyncio.run(store.write(_session(0), alone=True))
        asyncio.run(store.write(_session(1)))
        assert committers == [threading.current_thread().name, "pool-writer"]
        assert _ids(store) == {"s0", "s1"}
    finally:
        store.close()


def test_a_lone_write_never_waits_on_the_callers_thread_for_a_locked_database(tmp_path):
    """Another process holds SQLite's write lock: the lone write goes to the writer, which
    waits for the lock, while the caller's event loop keeps running."""
    store = Store(f"sqlite:///{tmp_path}/pool.db")
    committers = _committers(store)
    other = sqlite3.connect(tmp_path / "pool.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write lock, as another writer would hold it

    async def scenario() -> float:
        write = asyncio.ensure_future(store.write(_session(0), alone=True))
        t0 = time.perf_counter()
        for _ in range(10):  # the loop is free: ten ticks while the write waits
            await asyncio.sleep(0.02)
        ticked = time.perf_counter() - t0
        assert not write.done()
        other.execute("COMMIT")  # the other process lets go
        await asyncio.wait_for(write, 30)
        return ticked

    try:
        assert asyncio.run(scenario()) < 5
        assert committers == ["pool-writer"]
        assert _ids(store) == {"s0"}
    finally:
        other.close()
        store.close()
