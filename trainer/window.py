"""Windowed-FIFO consumption of finished groups (issue 7, item 1).

Groups are ordered by when their rollouts started. The window is the W groups starting at
its head, the oldest unconsumed group; the trainer may take any *finished*, unconsumed group
inside it. Consuming a group behind the head leaves a hole but does not move the window: it
slides only when its head is consumed. W=1 is strict FIFO (wait for the oldest group);
W=None is greedy (any finished group). A small W bounds how stale the data can get, a large
W keeps the trainer busy while a slow group (long agent run) finishes.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from envhub.trainer.source import Group, GroupInfo, TrajectorySource, load_group


class GroupWindow:
    """Chooses which groups to train on next; remembers which were consumed (for resume)."""

    def __init__(self, source: TrajectorySource, window: int | None = 1, *,
                 group_size: int | None = None, consumed: Iterable[str] = ()) -> None:
        if window is not None and window < 1:
            raise ValueError("window must be >= 1 (or None for greedy)")
        self.source = source
        self.window = window
        self.group_size = group_size
        self._consumed: set[str] = set(consumed)

    @property
    def consumed(self) -> Set[str]:
        """Groups taken or skipped. The window alone changes it (`take`, `skip`, `restore`):
        the loop and the producer read it."""
        return self._consumed

    def skip(self, group_ids: Iterable[str]) -> set[str]:
        """Mark finished groups consumed without loading them (nothing in them to train on);
        returns those not consumed before."""
        new = set(group_ids) - self._consumed
        self._consumed |= new
        return new

    def restore(self, consumed: Iterable[str]) -> None:
        """The consumed set of a checkpoint (resume)."""
        self._consumed = set(consumed)

    def ready(self) -> list[GroupInfo]:
        """Finished groups the window allows now, oldest first."""
        groups = self.source.list_groups()
        head = next((i for i, g in enumerate(groups) if g.group_id not in self._consumed),
                    len(groups))
        candidates = groups[head:] if self.window is None else groups[head:head + self.window]
        return [g for g in candidates
                if g.group_id not in self._consumed and g.finished(self.group_size)]

    def take(self, n: int) -> list[Group]:
        """Up to `n` groups (fewer when not enough are ready), marked consumed.

        Taking a group can move the window's head, which admits new candidates: the window
        is re-evaluated after each take so `take(n)` equals n successive `take(1)` calls.
        """
        taken: list[Group] = []
        while len(taken) < n:
            ready = self.ready()
            if not ready:
                break
            info = ready[0]
            taken.append(load_group(self.source, info))
            self._consumed.add(info.group_id)
        return taken
