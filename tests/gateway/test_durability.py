"""`kill -9` of the gateway during 32 concurrent sessions, then restart: every turn whose
response a client received is in the pool."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import agent, free_port, start_gateway

SESSIONS = 32


async def drive(url: str, proc: subprocess.Popen, answered: list) -> None:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(agent(url, f"dur-{i}", answered, stop))
             for i in range(SESSIONS)]
    while len(answered) < SESSIONS * 8:
        await asyncio.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # mid-flight: many calls are in progress right now
    proc.wait()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)


@pytest.mark.slow
def test_kill_9_loses_no_answered_turn(tmp_path: Path):
    db = f"sqlite:///{tmp_path}/pool.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_gateway(db, port)
    answered: list[tuple[str, int, str]] = []
    try:
        asyncio.run(drive(url, proc, answered))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(answered) >= SESSIONS * 8
    proc = start_gateway(db, port)
    try:
        recorded = {}
        for i in range(SESSIONS):
            t = httpx.get(f"{url}/sessions/dur-{i}/trajectory", timeout=30).json()
            recorded.update({(f"dur-{i}", turn["seq"]): turn for turn in t["turns"]})
        missing = [(k, s) for k, s, _ in answered if (k, s) not in recorded]
        assert missing == []
        # and a session continues its token history after the restart
        last_key = answered[-1][0]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=last_key, max_retries=0)
        assert client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "fresh"}]).choices
    finally:
        proc.kill()
        proc.wait()
