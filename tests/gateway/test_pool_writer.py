"""The pool's writes on SQLite: what an event loop's requests write during one iteration commits
in one transaction on the loop's own thread; a locked database or a failed batch goes to the
writer thread, which waits for the lock and lets one bad write fail alone."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

from sqlalchemy import event, select
from sqlalchemy.exc import IntegrityError

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


def test_writes_of_one_loop_iteration_commit_together_on_the_loops_thread(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/pool.db")
    committers = _committers(store)

    async def scenario() -> None:
        await asyncio.gather(*(store.write(_session(i)) for i in range(5)))
        await store.write(_session(5))

    try:
        asyncio.run(scenario())
        assert committers == [threading.current_thread().name] * 2  # 5 writes, then 1
        assert _ids(store) == {f"s{i}" for i in range(6)}
    finally:
        store.close()


def test_one_bad_write_fails_alone(tmp_path):
    """A batch with a duplicate key is rolled back and handed to the writer thread, which
    commits the good writes and fails only the bad one."""
    store = Store(f"sqlite:///{tmp_path}/pool.db")
    committers = _committers(store)

    async def scenario() -> list:
        await store.write(_session(0))
        return await asyncio.gather(store.write(_session(1)), store.write(_session(0)),
                                    store.write(_session(2)), return_exceptions=True)

    try:
        first, dup, last = asyncio.run(scenario())
        assert first is None and last is None
        assert isinstance(dup, IntegrityError)
        assert _ids(store) == {"s0", "s1", "s2"}
        assert committers[1:] == ["pool-writer", "pool-writer"]  # s1 and s2, one by one
    finally:
        store.close()


def test_a_locked_database_never_blocks_the_event_loop(tmp_path):
    """Another process holds SQLite's write lock: the write goes to the writer thread, which
    waits for the lock, while the event loop keeps running."""
    store = Store(f"sqlite:///{tmp_path}/pool.db")
    committers = _committers(store)
    other = sqlite3.connect(tmp_path / "pool.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write lock, as another writer would hold it

    async def scenario() -> float:
        write = asyncio.ensure_future(store.write(_session(0)))
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


def test_two_event_loops_write_to_one_store(tmp_path):
    """Gateways in threads of one process (tests, embedded runs) share a store: each loop
    commits its own writes, and they never share the connection at the same time."""
    store = Store(f"sqlite:///{tmp_path}/pool.db")
    loops = 2

    def run(k: int) -> None:
        async def many() -> None:
            for j in range(50):
                await asyncio.gather(*(store.write(_session(1000 * k + 10 * j + i))
                                       for i in range(3)))
        asyncio.run(many())

    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(loops)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert len(_ids(store)) == loops * 150
    finally:
        store.close()


def test_checkpoints_run_off_the_loop(tmp_path, monkeypatch):
    """SQLite's own checkpoint (inside the commit crossing 1,000 WAL pages) is off; the
    checkpointer thread copies the WAL into the database, and truncates a WAL grown past
    WAL_RESTART_PAGES."""
    import envhub.gateway.pool.store as store_module

    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_S", 0.05)
    monkeypatch.setattr(store_module, "WAL_RESTART_PAGES", 8)
    db = tmp_path / "pool.db"
    store = Store(f"sqlite:///{db}")
    try:
        with store.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
        before = db.stat().st_size

        async def scenario() -> None:
            for i in range(40):
                await asyncio.gather(*(store.write(_session(i * 10 + j)) for j in range(10)))

        asyncio.run(scenario())
        deadline = time.monotonic() + 10
        wal = tmp_path / "pool.db-wal"
        while (db.stat().st_size == before or wal.stat().st_size > 0) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert db.stat().st_size > before  # the rows reached the database file
        assert wal.stat().st_size == 0  # truncated: it had grown past 8 pages
        assert len(_ids(store)) == 400
    finally:
        store.close()
