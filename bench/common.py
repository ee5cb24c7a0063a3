"""Shared pieces of the benchmarks: start envhub processes, drive HTTP load, summarise."""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], health_url: str, env: dict | None = None,
          timeout: float = 120) -> subprocess.Popen:
    """Start a server process and wait until `health_url` answers 200. Its output goes to a
    temp file: an undrained pipe would block a chatty server once the pipe buffer fills."""
    log = tempfile.NamedTemporaryFile(prefix="envhub-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    deadline = time.time() + timeout
    import urllib.request

    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[:4]} exited: {open(log.name).read()[-2000:]}")
        try:
            with urllib.request.urlopen(health_url, timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{args[:4]} did not become healthy at {health_url}")


def envhub(*args: str) -> list[str]:
    return [sys.executable, "-m", "envhub", *args]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def load(make_call: Callable[[aiohttp.ClientSession, int, int], Awaitable[Any]],
               concurrency: int, calls: int) -> dict[str, float]:
    """`calls` requests from `concurrency` workers; returns req/s and latency percentiles (ms).

    `make_call(http, worker, i)` performs one call and raises on failure.
    """
    latencies: list[float] = []
    errors = 0
    per_worker = calls // concurrency
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=60)) as http:
        async def worker(w: int) -> None:
            nonlocal errors
            for i in range(per_worker):
                t0 = time.perf_counter()
                try:
                    await make_call(http, w, i)
                except Exception:
                    errors += 1
                    continue
                latencies.append((time.perf_counter() - t0) * 1000)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"rps": len(latencies) / wall, "p50": statistics.median(latencies),
            "p99": pct(latencies, 0.99), "errors": errors, "n": len(latencies)}


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system, seconds) a process has used so far: this one when `pid` is
    None (Linux /proc for others)."""
    if pid is None:
        return time.process_time()
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
