"""reasoning-gym runs in worker processes: they generate the entries and score the answers.

Why processes: `score_answer` is third-party code fed the agent's text, and some of reasoning-
gym's parse it with sympy, which evaluates `9**9**9**9` for minutes in one C call that holds the
GIL (a thread with a timeout would freeze the rollout process); one that overruns is killed and
replaced. Why entries too: several generators depend on Python's string hashing
(isomorphic_strings, list_functions, polynomial_multiplication, ransom_note), so two processes
with different PYTHONHASHSEEDs give different tasks under the same ids; every worker runs with
PYTHONHASHSEED=0, so every process sees the same tasks.

Each process keeps a small pool (POOL_SIZE) of workers, each used by one request at a time; the
time limit counts from when a worker has the request, not the wait for one. Answers that a
scorer would run as Python are screened host-side first (screen.py); the worker is defence in
depth: replies go to a private copy of its stdout (fd 1 and sys.stdout point at stderr, which is
discarded), requests come from a private copy of stdin, it has memory and CPU limits, and it
exits when its parent does.

Protocol, one JSON line each way. Host: {"id", "op": "score", "key": RGSpec.key, "index",
"answer"} or {"id", "op": "entries", "key", "start", "stop"}. Worker: {"id", "score": float} or
{"id", "error": why} or {"id", "entries": [{"question", "answer", "metadata"}, ...]} (JSON-safe
copies). A reply that is not one of these, or with another id, kills the worker.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import queue
import secrets
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

READY = b"ready\n"
START_TIMEOUT_S = 120.0  # importing reasoning-gym takes seconds on a loaded machine
ENTRIES_TIMEOUT_S = 600.0
MAX_SCORE_REPLY = 4096
MAX_ENTRIES_REPLY = 256 << 20
POOL_SIZE = max(1, min(4, os.cpu_count() or 1))
MEMORY_LIMIT = 2 << 30  # bytes of address space per worker
WORKER_ENV = {"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}


@dataclass
class Scored:
    """A score in [0, 1], or why there is none: `error` (the answer made the scorer raise, overrun
    or misbehave) or `failure` (the worker could not run at all: infrastructure)."""

    score: float = 0.0
    error: str | None = None
    failure: str | None = None


class WorkerError(Exception):
    """The worker overran, died or sent a bad reply (it has been killed)."""


class Worker:
    """One worker process (blocking: call it in a thread; one request at a time)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def request(self, message: dict[str, Any], timeout_s: float, limit: int) -> dict[str, Any]:
        """Send `message`, return the worker's validated reply; WorkerError when the worker
        overruns `timeout_s` (counted from the send), dies or misbehaves. OSError/RuntimeError
        when it cannot start."""
        proc = self._started()
        nonce = secrets.token_hex(8)
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps({**message, "id": nonce}).encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            self.stop()
            raise WorkerError("the worker died before the request reached it") from None
        line = self._line(time.monotonic() + timeout_s, limit)
        if line is None:
            self.stop()
            raise WorkerError(f"took over {timeout_s:g}s")
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or reply.get("id") != nonce or not _valid(reply):
            self.stop()  # a desynchronised or forged reply: nothing after it can be trusted
            raise WorkerError("the worker sent a malformed reply")
        return reply

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        env = {**os.environ, **WORKER_ENV, "ENVHUB_RG_PARENT": str(os.getpid())}
        self._proc = subprocess.Popen([sys.executable, "-m", "envhub.envs.rg.worker"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=env)
        self._buffer = b""
        if self._line(time.monotonic() + START_TIMEOUT_S, 64) != READY.strip():
            self.stop()
            raise RuntimeError(f"no ready line within {START_TIMEOUT_S:g}s (is reasoning-gym "
                               "importable by this interpreter?)")
        return self._proc

    def _line(self, deadline: float, limit: int) -> bytes | None:
        """The next reply line (without its newline), read with os.read against `deadline`;
        None on overrun, end of file or a line past `limit` bytes."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if len(self._buffer) > limit:
                return None
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line if len(line) <= limit else None

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def _valid(reply: dict[str, Any]) -> bool:
    if "score" in reply:
        score = reply["score"]
        return isinstance(score, int | float) and not isinstance(score, bool) and \
            math.isfinite(score)
    if "entries" in reply:
        return isinstance(reply["entries"], list) and all(
            isinstance(e, dict) and isinstance(e.get("question"), str) for e in reply["entries"])
    return isinstance(reply.get("error"), str)


class ScorerPool:
    """POOL_SIZE workers, started on demand; each request takes an idle one."""

    def __init__(self, size: int = POOL_SIZE) -> None:
        self._idle: queue.LifoQueue[Worker] = queue.LifoQueue()
        for _ in range(size):
            self._idle.put(Worker())
        self._all = list(self._idle.queue)
        self.size = size

    def _call(self, message: dict[str, Any], timeout_s: float, limit: int) -> dict[str, Any]:
        worker = self._idle.get()  # the wait for a worker does not count against timeout_s
        try:
            return worker.request(message, timeout_s, limit)
        finally:
            self._idle.put(worker)

    def score(self, key: str, index: int, answer: str, timeout_s: float) -> Scored:
        message = {"op": "score", "key": key, "index": index, "answer": answer}
        try:
            reply = self._call(message, timeout_s, MAX_SCORE_REPLY)
        except (OSError, RuntimeError) as e:
            return Scored(failure=f"the scorer worker did not start: {e}")
        except WorkerError as e:
            return Scored(error=f"the scorer {e} on the answer")
        if "score" in reply:
            return Scored(score=float(reply["score"]))
        return Scored(error=str(reply.get("error", "no score"))[:300])

    def entries(self, key: str, start: int, stop: int) -> list[dict[str, Any]]:
        """Entries start..stop-1 (JSON-safe copies) as the workers generate them; RuntimeError
        when they cannot."""
        message = {"op": "entries", "key": key, "start": start, "stop": stop}
        try:
            reply = self._call(message, ENTRIES_TIMEOUT_S, MAX_ENTRIES_REPLY)
        except (OSError, RuntimeError, WorkerError) as e:
            raise RuntimeError(f"the reasoning-gym worker could not generate entries: {e}") \
                from None
        if "entries" not in reply or len(reply["entries"]) != stop - start:
            raise RuntimeError(f"reasoning-gym could not generate entries {start}..{stop - 1}: "
                               f"{reply.get('error', 'a short reply')}")
        return list(reply["entries"])

    def close(self) -> None:
        for worker in self._all:
            worker.stop()


_POOL: ScorerPool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> ScorerPool:
    """This process's worker pool (workers start at their first request, stop at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ScorerPool()
            atexit.register(_POOL.close)
        return _POOL
