"""Which instance serves a session's next call.

A session sticks to the instance that served it, so the engine's prefix (KV) cache holds its
history. It moves only when that instance leaves rotation or holds more than `load_factor` x
its fair share of the sessions (consistent hashing with bounded load, Mirrokni et al. 2018:
load = sessions assigned, so short bursts of calls never move a warm session). A new (or
moved) session goes to the least-loaded instance in rotation: fewest calls in flight from this
gateway, then fewest sessions; remaining ties are broken by the session's order on a
consistent-hash ring, so an idle fleet spreads sessions evenly and several gateways agree on a
session's first placement.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import Counter, OrderedDict
from collections.abc import Sequence

from envhub.gateway.fleet.instance import Instance

VNODES = 64  # ring points per instance: enough for an even spread of tie-breaks


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Ring:
    """Consistent-hash ring over instance names."""

    def __init__(self, names: Sequence[str], vnodes: int = VNODES):
        points = sorted((_point(f"{n}#{v}"), n) for n in names for v in range(vnodes))
        self._keys = [p for p, _ in points]
        self._names = [n for _, n in points]
        self._count = len(set(names))

    def order(self, key: str) -> list[str]:
        """Instance names clockwise from the key's point, each once."""
        seen: list[str] = []
        if not self._keys:
            return seen
        start = bisect.bisect(self._keys, _point(key))
        for i in range(len(self._keys)):
            name = self._names[(start + i) % len(self._keys)]
            if name not in seen:
                seen.append(name)
                if len(seen) == self._count:
                    break
        return seen


class Placement:
    """Session → instance table (LRU-bounded) plus the placement rule above."""

    def __init__(self, names: Sequence[str], load_factor: float = 1.5,
                 max_sessions: int = 200_000):
        self.ring = Ring(names)
        self.load_factor = load_factor
        self.max_sessions = max_sessions
        self._table: OrderedDict[str, str] = OrderedDict()
        self._sessions: Counter[str] = Counter()  # sessions assigned per instance
        self.moves = 0  # sessions that had to leave their instance

    def pick(self, session_id: str, candidates: Sequence[Instance]) -> Instance:
        """The instance for this session's next call; `candidates` are the instances in
        rotation not yet tried by this call (non-empty)."""
        assert candidates, "pick() needs at least one candidate instance"
        by_name = {c.name: c for c in candidates}
        current = self._table.get(session_id) if session_id else None
        if current is not None:
            inst = by_name.get(current)
            if inst is not None and self._sessions[current] <= self._bound(candidates):
                self._table.move_to_end(session_id)
                return inst
            self.moves += 1
        rank = {n: i for i, n in enumerate(self.ring.order(session_id or ""))}
        choice = min(candidates, key=lambda c: (c.in_flight, self._sessions[c.name],
                                                rank.get(c.name, 0)))
        if session_id:
            self.remember(session_id, choice.name)
        return choice

    def remember(self, session_id: str, name: str) -> None:
        old = self._table.get(session_id)
        if old is not None:
            self._sessions[old] -= 1
        self._table[session_id] = name
        self._sessions[name] += 1
        self._table.move_to_end(session_id)
        while len(self._table) > self.max_sessions:
            _, evicted = self._table.popitem(last=False)
            self._sessions[evicted] -= 1

    def sessions_on(self, name: str) -> int:
        return self._sessions[name]

    def _bound(self, candidates: Sequence[Instance]) -> int:
        # Fair share of the sessions the candidates hold, times the factor (+1: rounding
        # must never move a session between instances holding 1 and 2 sessions).
        total = sum(self._sessions[c.name] for c in candidates)
        return math.ceil(self.load_factor * total / len(candidates)) + 1
