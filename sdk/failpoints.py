"""Named places where a process can be made to die on purpose, for crash tests.

`hit("checkpoint.write")` does nothing unless ENVHUB_FAILPOINTS names that place: with
`ENVHUB_FAILPOINTS="checkpoint.write=2,weights.push=3"` the process kills itself with SIGKILL
(as `kill -9`, an OOM kill or a lost node would: no handler, no clean-up runs) the 2nd time it
reaches "checkpoint.write", or the 3rd time it reaches "weights.push". Tests use it to stop a
real `envhub train` at a moment a timer would rarely hit (inside a checkpoint write, inside a
weight push); the places are in the code that writes checkpoints and pushes weights.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["ENV", "hit"]

ENV = "ENVHUB_FAILPOINTS"
_counts: dict[str, int] = {}
_lock = threading.Lock()


def _armed() -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in os.environ.get(ENV, "").split(","):
        name, _, nth = item.strip().partition("=")
        if name:
            armed[name] = int(nth) if nth.strip().isdigit() else 1
    return armed


def hit(name: str) -> None:
    """Count a pass through `name`; SIGKILL this process on the pass ENVHUB_FAILPOINTS says."""
    if ENV not in os.environ:
        return
    nth = _armed().get(name)
    if nth is None:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        count = _counts[name]
    if count == nth:
        os.kill(os.getpid(), signal.SIGKILL)
