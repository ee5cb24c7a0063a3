"""The worker process of scorer.py (`python -m envhub.envs.rg.worker`): generates entries and
scores answers, one JSON request per line, until its request pipe closes.

It guards its reply channel before any request: replies go to a private copy of fd 1, and fd 1
(with sys.stdout) then points at stderr, so whatever a scorer prints, or code a scorer runs
writes to fd 1, never reaches the host as a reply. Requests come from a private copy of fd 0
(fd 0 becomes /dev/null). Memory is capped (RLIMIT_AS), CPU per request (RLIMIT_CPU), and a
watchdog thread exits when the parent is gone, so a stuck sympy call dies with the host.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from typing import IO, Any

from envhub.envs.rg.scorer import MEMORY_LIMIT, READY

CPU_PER_REQUEST_S = 120  # the host kills an overrun sooner; this is for an orphaned worker


def main() -> None:
    requests, replies = _private_channels()
    _limit_memory()
    _watch_parent()
    from envhub.envs.rg.spec import RGSpec, dataset, require_reasoning_gym

    require_reasoning_gym()  # before the ready line: a request's time limit is its work only
    datasets: dict[str, Any] = {}
    _send(replies, None)
    for line in requests:
        _limit_cpu()
        try:
            request = json.loads(line)
            nonce, key = request["id"], request["key"]
        except (ValueError, KeyError, TypeError):
            return  # not the host's: stop, the host restarts a worker
        try:
            if key not in datasets:
                name, seed, size, config = json.loads(key)
                datasets[key] = dataset(RGSpec(name, seed, size, config))
            data = datasets[key]
            if request["op"] == "entries":
                reply: dict[str, Any] = {"entries": [
                    _entry(data[i]) for i in range(request["start"], request["stop"])]}
            else:
                entry = data[int(request["index"])]
                reply = {"score": float(data.score_answer(request["answer"], entry))}
        except Exception as e:  # noqa: BLE001 - the answer's doing; the host decides
            reply = {"error": f"the scorer raised {type(e).__name__}: {str(e)[:200]}"}
        _send(replies, {**reply, "id": nonce})


def _private_channels() -> tuple[IO[bytes], IO[bytes]]:
    replies = os.fdopen(os.dup(1), "wb")
    requests = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    return requests, replies


def _send(replies: IO[bytes], reply: dict[str, Any] | None) -> None:
    text = READY if reply is None else json.dumps(reply).encode() + b"\n"
    replies.write(text)
    replies.flush()


def _entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A JSON-safe copy of an entry (tuples → lists, anything else unknown → its str)."""
    return {k: _plain(entry.get(k)) for k in ("question", "answer", "metadata")}


def _plain(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)


def _limit_memory() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _limit_cpu() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + CPU_PER_REQUEST_S
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _watch_parent() -> None:
    parent = int(os.environ.get("ENVHUB_RG_PARENT") or os.getppid())

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


if __name__ == "__main__":
    main()
