"""The trainer's view of the producer's groups: a `TrajectorySource` in generation (launch)
order, read from the pool over the gateway's HTTP API.

A group is listed as finished only once the producer has scored and closed all of it; until
then it is listed empty (never finished), so the window's head waits for it even before its
first session exists in the pool. Evaluation sessions are never listed (the producer did not
launch them as training groups). A session the pool still lists as open once the producer is
done with its group is one whose close never got through (the runner retries it with the
admin key first): it is left out, so the group is finished without it (and padded) rather
than awaited forever.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence, Set
from dataclasses import dataclass

from envhub.orchestrator.training.ledger import GroupLedger
from envhub.sdk.types import SessionStatus, Trajectory
from envhub.trainer.source import GroupInfo, HttpSource
from envhub.trainer.window import GroupWindow

log = logging.getLogger(__name__)


class LaunchOrderSource:
    def __init__(self, http: HttpSource, ledger: GroupLedger,
                 trained: Set[str] = frozenset()) -> None:
        """`trained`: the groups a resumed run's checkpoint consumed, listed without asking
        the gateway for their sessions (nothing reads them: the window passes them)."""
        self.http, self.ledger = http, ledger
        self._done: dict[str, GroupInfo] = {}  # finished groups' listings (they never change)
        self._trained = trained

    def list_groups(self) -> list[GroupInfo]:
        order, done = self.ledger.snapshot()
        out = []
        for gid in order:
            if gid in self._trained:
                out.append(GroupInfo(gid, ()))
                continue
            if gid in done and gid not in self._done:
                sessions = sorted(self.http.sessions(group_id=gid),
                                  key=lambda s: (s.sample_index, s.id))
                unclosed = [s.id for s in sessions if s.status == SessionStatus.open]
                if unclosed:
                    log.warning("group %s: sessions %s are still open after their rollouts "
                                "ended (their close never reached the gateway); training "
                                "without them", gid, ", ".join(unclosed))
                    sessions = [s for s in sessions if s.status != SessionStatus.open]
                self._done[gid] = GroupInfo(gid, tuple(sessions))
            out.append(self._done.get(gid, GroupInfo(gid, ())))
        return out

    def fetch(self, session_ids: Sequence[str]) -> list[Trajectory]:
        return self.http.fetch(session_ids)

    def empty_done(self) -> set[str]:
        """Finished groups with no session in the pool (every sample failed before its session
        opened): nothing to train, so the window may pass them."""
        return {g.group_id for g in self._done.values() if not g.sessions}


@dataclass(frozen=True)
class WaitState:
    """What the trainer waits on: the window's head and the finished groups it may not take
    yet (beyond head + window)."""

    head: str | None
    window: int | None
    ready: list[str]  # finished groups inside the window (fewer than the step needs)
    beyond: list[str]  # finished, unconsumed groups past the window


def wait_state(window: GroupWindow, groups: list[GroupInfo]) -> WaitState:
    live = [g for g in groups if g.group_id not in window.consumed]
    head = live[0].group_id if live else None
    start = next((i for i, g in enumerate(groups) if g.group_id == head), len(groups))
    end = len(groups) if window.window is None else start + window.window
    finished = [g.group_id for g in groups if g.group_id not in window.consumed and g.finished()]
    inside = {g.group_id for g in groups[start:end]}
    return WaitState(head, window.window, [g for g in finished if g in inside],
                     [g for g in finished if g not in inside])
