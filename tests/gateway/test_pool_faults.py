"""A pool that cannot write says so: every call it cannot record is a 503 naming the pool, with
Retry-After, in each API's own error shape; `/health` is not ready while it lasts and ready
again after, without a restart; and no answered call is missing from the pool. Real gateways
(their own processes, the zero-work engine) with the official clients: a SQLite pool on a
tmpfs filled to the last byte, and a PostgreSQL server stopped and started again."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.support import free_port, require, start_gateway, until

SESSIONS = 16


class Drive:
    """SESSIONS agents calling one gateway in a loop: each answered call is kept (session,
    seq), each refused one must be a 503 that names the pool."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answered: list[tuple[str, int]] = []
        self.refused: list[str] = []
        self.refused_by: dict[str, int] = {}  # session key -> its calls refused
        self.other: list[str] = []  # anything else: a failure of the test
        self.stop = asyncio.Event()

    async def agent(self, key: str) -> None:
        client = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0,
                                    timeout=30)
        msgs: list = [{"role": "user", "content": f"session {key}"}]
        while not self.stop.is_set():
            try:
                resp = await client.chat.completions.create(model="default", messages=msgs)
            except openai.APIStatusError as e:
                if e.status_code == 503 and "data pool" in e.message \
                        and e.response.headers.get("retry-after"):
                    self.refused.append(e.message)
                    self.refused_by[key] = self.refused_by.get(key, 0) + 1
                else:
                    self.other.append(f"{e.status_code}: {e.message}")
                await asyncio.sleep(0.05)
                continue
            except openai.APIError as e:
                self.other.append(f"{type(e).__name__}: {e}")
                return
            self.answered.append((key, resp.model_extra["envhub"]["seqs"][0]))
            msgs += [resp.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": "again"}]

    async def run(self, fault) -> None:
        """Agents running; `fault(self)` (a coroutine) breaks and mends the pool meanwhile."""
        tasks = [asyncio.create_task(self.agent(f"pf-{i}")) for i in range(SESSIONS)]
        try:
            await fault(self)
        finally:
            self.stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)

    async def until_answered(self, more: int, within_s: float = 120) -> None:
        goal = len(self.answered) + more
        for _ in range(int(within_s / 0.05)):
            if len(self.answered) >= goal:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{len(self.answered)} answered, waited for {goal}: {self.other}")

    async def until_refused(self, more: int, within_s: float = 120) -> None:
        goal = len(self.refused) + more
        for _ in range(int(within_s / 0.05)):
            if len(self.refused) >= goal:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{len(self.refused)} refused, waited for {goal}: {self.other}")

    def check_recorded(self) -> None:
        """Every answered call is in the pool, read back through the gateway."""
        recorded = set()
        for i in range(SESSIONS):
            t = httpx.get(f"{self.url}/sessions/pf-{i}/trajectory", timeout=30)
            if t.status_code == 404:
                continue  # never got a call through
            recorded |= {(f"pf-{i}", turn["seq"]) for turn in t.json()["turns"]}
        missing = [a for a in self.answered if a not in recorded]
        assert missing == [] and len(set(self.answered)) == len(self.answered)


def drive_through(url: str, fault, says: str) -> None:
    """SESSIONS agents on `url` while `fault` breaks and mends the pool: nothing but answers
    and 503s that say `says`, and every answer recorded."""
    drive = Drive(url)
    asyncio.run(drive.run(fault))
    assert drive.other == []
    assert all(says in m for m in drive.refused), drive.refused[:3]
    drive.check_recorded()
    # what the runner reads after an agent (so that a command agent's failure then is the
    # pool's, env_failure): each session's refused calls, counted by the gateway
    seen = {key for key, _ in drive.answered}
    for key in sorted(seen):
        faults = httpx.get(f"{url}/sessions/{key}/pool_faults", timeout=30).json()
        assert faults["refused"] == drive.refused_by.get(key, 0), (key, faults)
        assert faults["refused"] == 0 or says in faults["reason"], faults
    assert sum(drive.refused_by.get(k, 0) for k in seen) > 0
    print(f"{says}: {len(drive.answered)} answered, all recorded; {len(drive.refused)} "
          "refused with 503")


def fill(filler: Path) -> None:
    """Write `filler` until its disk is full, to the last byte."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


def health(url: str) -> httpx.Response:
    return httpx.get(f"{url}/health", timeout=30)


def anthropic_refusal(url: str) -> anthropic.APIStatusError:
    c = anthropic.Anthropic(base_url=url, api_key="pf-anthropic", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as e:
        c.messages.create(model="default", max_tokens=8,
                          messages=[{"role": "user", "content": "hi"}])
    return e.value


def test_a_full_disk_is_a_503_naming_the_pool_and_health_recovers_by_itself(tmp_path: Path):
    require(os.geteuid() == 0, "root (to mount a tmpfs of a fixed size)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], check=True)
    port = free_port()
    proc = start_gateway(f"sqlite:///{disk / 'pool.db'}", port)
    url = f"http://127.0.0.1:{port}"
    filler = disk / "filler"

    async def fault(drive: Drive) -> None:
        await drive.until_answered(4 * SESSIONS)
        fill(filler)
        await drive.until_refused(2 * SESSIONS)
        during = await asyncio.to_thread(health, url)
        assert during.status_code == 503, during.text
        assert during.json()["status"] == "not_ready" and "disk is full" in during.json()["pool"]
        refused = await asyncio.to_thread(anthropic_refusal, url)  # Anthropic's own shape
        assert refused.status_code == 503 and "data pool" in refused.message
        assert refused.response.headers["retry-after"]
        assert refused.body["type"] == "error"
        filler.unlink()
        assert await asyncio.to_thread(until, lambda: health(url).status_code == 200, 60)
        await drive.until_answered(4 * SESSIONS)

    try:
        drive_through(url, fault, "disk is full")
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.postgres
def test_a_postgres_restart_is_a_503_naming_the_pool_and_health_recovers(tmp_path: Path):
    from tests.postgres import PostgresServer

    server = PostgresServer().start()
    port = free_port()
    try:
        proc = start_gateway(server.create_database(), port)
        url = f"http://127.0.0.1:{port}"

        async def fault(drive: Drive) -> None:
            await drive.until_answered(4 * SESSIONS)
            await asyncio.to_thread(server.halt)
            await drive.until_refused(2 * SESSIONS)
            during = await asyncio.to_thread(health, url)
            assert during.status_code == 503, during.text
            assert "unreachable" in during.json()["pool"], during.text
            await asyncio.to_thread(server.restart)
            assert await asyncio.to_thread(until, lambda: health(url).status_code == 200, 60)
            await drive.until_answered(4 * SESSIONS)

        try:
            drive_through(url, fault, "unreachable")
        finally:
            proc.kill()
            proc.wait()
    finally:
        server.stop()


AGENT = '''
import os, pathlib, sys, time
import openai
mark = pathlib.Path(os.environ["POOL_FAULT_MARK"])
client = openai.OpenAI(max_retries=0, timeout=30)
msgs = [{"role": "user", "content": "hi"}]
client.chat.completions.create(model="default", messages=msgs)
(mark / "first").touch()
while True:  # until the gateway refuses a call: then give up, as many a CLI does
    try:
        client.chat.completions.create(model="default", messages=msgs)
    except openai.APIStatusError as e:
        (mark / "refused").write_text(str(e.status_code))
        sys.exit(3)
    time.sleep(0.05)
'''


def test_a_command_agent_that_gives_up_on_pool_refusals_is_env_failure(tmp_path: Path):
    """A command agent whose call the gateway refuses because the pool's disk is full exits 3,
    as a CLI that gives up would: the rollout is env_failure naming the pool (the agent did
    nothing wrong), not the agent_error of its exit code."""
    require(os.geteuid() == 0, "root (to mount a tmpfs of a fixed size)")
    disk, mark = tmp_path / "disk", tmp_path / "mark"
    disk.mkdir()
    mark.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], check=True)
    port = free_port()
    proc = start_gateway(f"sqlite:///{disk / 'pool.db'}", port, ["--admin-key", "pf-admin"])
    (tmp_path / "agent.py").write_text(AGENT)
    filler = disk / "filler"
    run = None
    try:
        run = subprocess.Popen(
            [sys.executable, "-m", "envhub", "run", "arith", "-n", "1", "--agent",
             f"{sys.executable} {tmp_path / 'agent.py'}", "--agent-on-host", "--gateway",
             f"http://127.0.0.1:{port}", "--admin-key", "pf-admin", "--out", "out", "-q"],
            cwd=tmp_path, env={**os.environ, "POOL_FAULT_MARK": str(mark)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert until(lambda: (mark / "first").exists() or run.poll() is not None, 300)
        fill(filler)
        assert until(lambda: (mark / "refused").exists() or run.poll() is not None, 120)
        assert (mark / "refused").read_text() == "503"
        filler.unlink()  # the pool can record again: the runner closes and records the rollout
        output, _ = run.communicate(timeout=300)
        [record] = [json.loads(p.read_text()) for p in (tmp_path / "out" / "rollouts").iterdir()]
        assert record["status"] == "env_failure", (record, output[-2000:])
        assert "data pool could not record" in record["reason"] and "disk is full" in record[
            "reason"], record["reason"]
    finally:
        if run is not None and run.poll() is None:
            run.kill()
        proc.kill()
        proc.wait()
        subprocess.run(["umount", "-l", str(disk)], check=False)
