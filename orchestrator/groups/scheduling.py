"""Which rollout to start next when a slot frees: FIFO, or Seer-style group-aware scheduling.

Seer (arXiv 2511.14617, "context-aware scheduling"): samples of one group (same task, same
prompt) have correlated lengths, so one probe sample per group is started first; what the probe
shows (tokens, turns or seconds) estimates the whole group's length, and the rest of the samples
are started longest-estimate first across groups, so the long groups do not start last and make
the tail. Groups whose probe is still running have no estimate yet: a probe that outlives the
others is likely long, so their samples go first (before any estimated group), in arrival order.
A finished sample updates its group's estimate to the longest seen in that group.

A policy is driven by its caller (the runner, a training loop's rollout producer, the simulation
in bench/bench_async.py --sim):

    policy = make_policy("seer")
    policy.add_group("g0", k=8)                  # as groups arrive
    nxt = policy.next()                          # (group, sample index) to start, or None
    policy.finished("g0", 0, Observation(tokens=812, turns=3, seconds=4.2))

SeerPolicy's measure is the agent's working seconds by default (what the runner knows of every
rollout); a loop that counts completion tokens passes `SeerPolicy(measure="tokens")`.

`next()` returns None when nothing is left to start; every added sample is returned exactly
once. Ties go to the group added first, then the lower sample index.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal, Protocol

from envhub.orchestrator.groups.plugins import load_named

Measure = Literal["tokens", "turns", "seconds"]

POLICIES = {
    "fifo": "envhub.orchestrator.groups.scheduling:FifoPolicy",
    "seer": "envhub.orchestrator.groups.scheduling:SeerPolicy",
}


@dataclass(frozen=True)
class Observation:
    """What a finished sample showed."""

    tokens: int = 0  # completion tokens over all its turns
    turns: int = 0
    seconds: float = 0.0

    def cost(self, measure: Measure) -> float:
        return float(getattr(self, measure))


class SchedulePolicy(Protocol):
    def add_group(self, group: str, k: int) -> None:
        """A new group of k samples (indices 0..k-1) to schedule."""

    def next(self) -> tuple[str, int] | None:
        """The sample to start now, or None when none is left to start."""

    def finished(self, group: str, index: int, shown: Observation) -> None:
        """A started sample ended (any status) and showed this."""


class FifoPolicy:
    """Groups in arrival order, each group's samples in index order (the baseline)."""

    def __init__(self) -> None:
        self._queue: deque[tuple[str, int]] = deque()

    def add_group(self, group: str, k: int) -> None:
        self._queue.extend((group, i) for i in range(k))

    def next(self) -> tuple[str, int] | None:
        return self._queue.popleft() if self._queue else None

    def finished(self, group: str, index: int, shown: Observation) -> None:
        return None


class SeerPolicy:
    """Probe one sample per group first, then the rest longest-estimate first across groups."""

    def __init__(self, measure: Measure = "seconds") -> None:
        self.measure: Measure = measure
        self._probes: deque[str] = deque()
        self._rest: dict[str, deque[int]] = {}  # samples not started yet, per group
        self._order: dict[str, int] = {}  # arrival rank (ties), of groups not fully started
        self._added = 0
        self.estimate: dict[str, float] = {}  # longest cost seen in the group so far

    def add_group(self, group: str, k: int) -> None:
        if group in self._order:
            raise ValueError(f"group {group!r} added twice")
        if k < 1:
            raise ValueError(f"group {group!r}: k must be >= 1, got {k}")
        self._order[group] = self._added
        self._added += 1
        self._probes.append(group)
        self._rest[group] = deque(range(1, k))

    def next(self) -> tuple[str, int] | None:
        if self._probes:
            group = self._probes.popleft()
            if not self._rest[group]:  # k = 1: nothing left to order
                self._forget(group)
            return group, 0
        waiting = [g for g, rest in self._rest.items() if rest]
        if not waiting:
            return None
        # unknown (probe still running) first, then longest estimate; arrival order breaks ties
        group = min(waiting, key=lambda g: (g in self.estimate, -self.estimate.get(g, 0.0),
                                            self._order[g]))
        rest = self._rest[group]
        index = rest.popleft()
        if not rest:
            self._forget(group)
        return group, index

    def _forget(self, group: str) -> None:
        """All its samples started: what was kept for ordering them has no more use (a training
        loop adds groups forever)."""
        del self._rest[group], self._order[group]
        self.estimate.pop(group, None)

    def finished(self, group: str, index: int, shown: Observation) -> None:
        if group not in self._rest:
            return
        cost = shown.cost(self.measure)
        self.estimate[group] = max(cost, self.estimate.get(group, cost))


def make_policy(name: str) -> SchedulePolicy:
    """A policy from the table's name or a `package.module:Class` path; RunConfigError (with
    the choices) when there is none."""
    policy: SchedulePolicy = load_named(name, POLICIES, "scheduling policy")
    return policy
