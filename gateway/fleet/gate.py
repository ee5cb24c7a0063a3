"""The pause gate in front of a fleet: while closed, new calls wait (bounded), then get 429."""

from __future__ import annotations

import asyncio
import time

from envhub.gateway.errors import Overloaded


class PauseGate:
    """Open by default. `close()` holds new calls; calls already past the gate are unaffected
    (the fleet drains them separately). A call that waits longer than `wait` seconds gets
    `Overloaded` (HTTP 429 with Retry-After), so clients can simply retry."""

    def __init__(self) -> None:
        self.paused = False
        self.waiting = 0
        self._open = asyncio.Event()
        self._open.set()

    async def enter(self, wait: float) -> None:
        if not self.paused:
            return
        self.waiting += 1
        deadline = time.monotonic() + wait
        try:
            # Loop: the gate may close again between the wake-up and this task running.
            while self.paused:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Overloaded(f"the engines are paused for a weight update (waited "
                                     f"{wait:g} s); retry after the Retry-After delay",
                                     retry_after=max(1.0, wait / 4))
                try:
                    await asyncio.wait_for(self._open.wait(), left)
                except TimeoutError:
                    continue
        finally:
            self.waiting -= 1

    def close(self) -> None:
        self.paused = True
        self._open.clear()

    def open(self) -> None:
        self.paused = False
        self._open.set()
