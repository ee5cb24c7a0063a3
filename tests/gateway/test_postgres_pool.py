"""The pool over a real PostgreSQL server: two gateways share it, and a kill -9 of both loses
no answered turn."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import openai
import pytest

from tests.support import agent, free_port, start_gateway

pytestmark = pytest.mark.postgres


@pytest.mark.slow
def test_two_gateways_one_pool_survive_kill_9(postgres_server):
    db = postgres_server.create_database()
    ports = [free_port(), free_port()]
    procs = [start_gateway(db, p) for p in ports]
    answered: list = []

    async def drive() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(agent(f"http://127.0.0.1:{ports[i % 2]}", f"pg-{i}",
                                           answered, stop)) for i in range(32)]
        while len(answered) < 32 * 6:
            await asyncio.sleep(0.05)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)

    try:
        asyncio.run(drive())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    # restart one gateway: it sees every session written by both
    proc = start_gateway(db, ports[0])
    try:
        url = f"http://127.0.0.1:{ports[0]}"
        recorded = set()
        for i in range(32):
            t = httpx.get(f"{url}/sessions/pg-{i}/trajectory", timeout=30).json()
            recorded |= {(f"pg-{i}", turn["seq"]) for turn in t["turns"]}
        assert [(k, s) for k, s, _ in answered if (k, s) not in recorded] == []
        rows = httpx.get(f"{url}/sessions", timeout=30).json()
        assert {r["id"] for r in rows} >= {f"pg-{i}" for i in range(32)}
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="pg-1", max_retries=0)
        assert c.chat.completions.create(model="default",
                                         messages=[{"role": "user", "content": "x"}]).choices
    finally:
        proc.kill()
        proc.wait()


def test_writer_survives_its_connection_dropped_by_the_server(postgres_server):
    """The pool writer keeps one connection between batches; when the server drops it (a
    restart, an idle timeout, an operator's pg_terminate_backend) the next write reconnects
    and commits instead of failing the call that made it."""
    from sqlalchemy import create_engine, select, text

    from envhub.gateway.pool import schema as t
    from envhub.gateway.pool.rows import session_insert
    from envhub.gateway.pool.store import Store

    db = postgres_server.create_database()
    store = Store(db)
    admin = create_engine(db.replace("postgresql://", "postgresql+psycopg://"))

    def write(i: int) -> None:
        asyncio.run(store.write(session_insert(f"s{i}", f"k{i}", group_id=None, task_id=None,
                                               env=None, sample_index=0, metadata=None)))

    try:
        write(0)
        with admin.connect() as c:
            killed = c.execute(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar()
        assert killed >= 1  # the writer's connection, open since the first write
        write(1)
        with admin.connect() as c:
            ids = {r[0] for r in c.execute(select(t.sessions.c.id))}
        assert ids == {"s0", "s1"}
    finally:
        store.close()
        admin.dispose()
