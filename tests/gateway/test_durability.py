"""`kill -9` of the gateway during 32 concurrent sessions, then restart: every turn whose
response a client received is in the pool."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

from tests.support import free_port

SESSIONS = 32


def start_gateway(db: str, port: int, extra: list[str] | None = None,
                  backend: str = "zero") -> subprocess.Popen:
    # output to a file: an undrained pipe would block the server once its buffer fills
    log = tempfile.NamedTemporaryFile(prefix="envhub-gw-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub", "gateway", "--backend", backend, "--port", str(port),
         "--db", db, *(extra or [])],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(open(log.name).read())
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("gateway did not start")


async def agent(url: str, key: str, answered: list, stop: asyncio.Event) -> None:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=10)
    msgs = [{"role": "user", "content": f"session {key}"}]
    while not stop.is_set():
        try:
            resp = await client.chat.completions.create(model="default", messages=msgs)
        except (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError):
            return  # the gateway died under us
        answered.append((key, resp.model_extra["envhub"]["seqs"][0],
                         resp.choices[0].message.content))
        msgs += [resp.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "again"}]


async def drive(url: str, proc: subprocess.Popen, answered: list) -> None:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(agent(url, f"dur-{i}", answered, stop))
             for i in range(SESSIONS)]
    while len(answered) < SESSIONS * 8:
        await asyncio.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # mid-flight: many calls are in progress right now
    proc.wait()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)


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
