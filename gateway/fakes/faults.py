"""Injected failures shared by the fake servers: `POST /fake/fail {count, status}`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Faults:
    count: int = 0
    status: int = 500

    def take(self) -> int | None:
        """The status the next generation call must answer, or None to answer normally."""
        if self.count <= 0:
            return None
        self.count -= 1
        return self.status
