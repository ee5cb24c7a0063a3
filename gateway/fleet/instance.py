"""One engine instance of a fleet: its client, whether it is in rotation, and its counters."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from envhub.gateway.backends.base import Backend

TOKENS_WINDOW_S = 10.0  # tokens/s on /metrics is measured over this trailing window


@dataclass
class Instance:
    """Routing state of one member. `in_rotation` False = drained: no new calls are routed to
    it, calls already running there finish (or fail and are retried elsewhere)."""

    name: str
    member: Backend  # the instance's client (VLLMBackend, SGLangBackend, ...)
    in_rotation: bool = False  # until the first successful probe
    reason: str = "not probed yet"
    weight_version: int = 0
    in_flight: int = 0
    misses: int = 0  # consecutive missed beats
    good_beats: int = 0  # consecutive answered beats
    errors_in_a_row: int = 0  # consecutive failed calls
    calls: int = 0
    failures: int = 0
    completion_tokens: int = 0
    removed_at_beat: int | None = None  # heartbeat round in which it left rotation
    added_at_beat: int | None = None
    # Last rotation changes (time, in rotation, why); bounded: a flapping instance must not
    # grow the gateway's memory.
    changes: deque[tuple[float, bool, str]] = field(default_factory=lambda: deque(maxlen=100))
    _recent: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens)

    def take_out(self, why: str, beat: int) -> bool:
        """Remove from rotation; True if it was in rotation."""
        self.reason = why
        self.good_beats = 0  # re-admission needs fresh evidence of health
        if not self.in_rotation:
            return False
        self.in_rotation = False
        self.removed_at_beat = beat
        self.changes.append((time.time(), False, why))
        return True

    def put_in(self, beat: int) -> bool:
        """Back into rotation; True if it was out."""
        self.misses = self.errors_in_a_row = 0
        self.reason = "healthy"
        if self.in_rotation:
            return False
        self.in_rotation = True
        self.added_at_beat = beat
        self.changes.append((time.time(), True, "healthy"))
        return True

    def record_tokens(self, n: int) -> None:
        now = time.monotonic()
        self.completion_tokens += n
        self._recent.append((now, n))
        self._trim(now)

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        self._trim(now)
        return sum(n for _, n in self._recent) / TOKENS_WINDOW_S

    def _trim(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] > TOKENS_WINDOW_S:
            self._recent.popleft()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.member.name, "in_rotation": self.in_rotation,
                "reason": self.reason, "weight_version": self.weight_version,
                "in_flight": self.in_flight, "calls": self.calls, "failures": self.failures,
                "misses": self.misses, "completion_tokens": self.completion_tokens,
                "tokens_per_second": round(self.tokens_per_second(), 3),
                "removed_at_beat": self.removed_at_beat, "added_at_beat": self.added_at_beat}
