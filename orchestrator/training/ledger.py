"""Every group of a training run from launch to trained: the one record of group state.

A group is
    launched   by the producer (`launch`): its id, its environment, its place in launch order;
    finished   by the producer (`finish`): all its samples scored, their sessions closed, with
               the rollout records;
    released   by the loop (`release`): the window consumed it (trained or passed), so its
               place in the producer's buffer frees up;
    settled    by the loop (`settle`): the trainer's count of the samples it trained and of
               those it dropped as stale (a group with no session settles with none).

Everyone else reads it through methods: the producer (how many groups are launched and not
released, how many are running), the launch-order source (the order and the finished groups),
the launch mix (each environment's counts), the loop's rows and `envhub view`'s mix columns.
The trainer's window keeps only its own memory of what it consumed (checkpointed for resume:
trainer/window.py); the loop releases here what the window consumed.

Thread-safe: the producer's thread launches and finishes, the trainer's thread releases and
settles and waits (`wait_finished`) for the next group to finish.

With a `GroupJournal` (OUT/groups.jsonl) every launch and every finish (with its records) is
also appended to disk, flushed and fsynced before the ledger moves on, so a run killed at any
moment knows on `--resume` which groups it launched, which finished (and what they scored) and
which were still running (orchestrator/training/resume.py). What the trainer had settled comes
from the checkpoint (`restore`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.orchestrator.groups.results import RolloutRecord


@dataclass(frozen=True)
class EnvCounts:
    """One environment's groups and samples so far."""

    launched: int  # groups launched
    settled: int  # groups the trainer is done with
    trained: float  # samples trained
    stale: int  # samples dropped as stale


@dataclass
class Journal:
    """What a groups.jsonl holds: the run id, every launch in order, every finish."""

    run_id: str | None = None
    launches: list[tuple[str, str]] = field(default_factory=list)  # (group id, environment)
    finished: dict[str, list[RolloutRecord]] = field(default_factory=dict)


class GroupJournal:
    """OUT/groups.jsonl, append-only: `{"run": id}` first, then `{"launch": gid, "env",
    "task"}` and `{"finish": gid, "records": [...]}` lines, each flushed and fsynced. A line
    torn by a kill is the last one, and `read` leaves it out (its group counts as not
    launched, or not finished)."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        fresh = not path.is_file() or path.stat().st_size == 0
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the run)
        if not fresh:
            self._file.write("\n")  # ends a line a kill tore, if any (read skips blank lines)
        self.write({"run": run_id})

    def write(self, entry: dict[str, Any]) -> None:
        self._file.write(json.dumps(entry) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    @staticmethod
    def read(path: Path) -> Journal:
        journal = Journal()
        if not path.is_file():
            return journal
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # blank, or torn by a kill
            if "run" in entry:
                journal.run_id = journal.run_id or str(entry["run"])
            elif "launch" in entry:
                journal.launches.append((str(entry["launch"]), str(entry["env"])))
            elif "finish" in entry:
                journal.finished[str(entry["finish"])] = [
                    RolloutRecord.model_validate(r) for r in entry["records"]]
        return journal


class GroupLedger:
    def __init__(self, run_id: str, envs: Sequence[str], k: int,
                 journal: GroupJournal | None = None) -> None:
        self.run_id, self.envs, self.k = run_id, list(envs), k
        if len(set(self.envs)) != len(self.envs):
            raise ValueError(f"environment names repeat ({', '.join(self.envs)}): each "
                             "environment of a run needs a name of its own")
        self._index = {name: i for i, name in enumerate(self.envs)}
        self._order: list[str] = []  # group ids, launch order
        self._env: dict[str, int] = {}  # group id -> index into envs
        self._records: dict[str, list[RolloutRecord]] = {}  # finished groups
        self._released: set[str] = set()
        self._settled: set[str] = set()
        n = len(self.envs)
        self._launched, self._settled_n = [0] * n, [0] * n
        self._trained, self._stale = [0.0] * n, [0] * n
        self._changed = threading.Condition()
        self._on_release: list[Callable[[], None]] = []
        self.journal = journal

    # -- the producer -------------------------------------------------------------------------

    def launch(self, env: str, task_id: str) -> str:
        """A new group of `env` on task `task_id`; returns its id (unique in the run)."""
        with self._changed:
            gid = f"{self.run_id}:{env}:{task_id}:g{len(self._order):06d}"
            if self.journal is not None:
                self.journal.write({"launch": gid, "env": env, "task": task_id})
            self._order.append(gid)
            self._env[gid] = self._index[env]
            self._launched[self._index[env]] += 1
            return gid

    def finish(self, gid: str, records: list[RolloutRecord]) -> None:
        """Every sample of `gid` is scored and its session closed."""
        with self._changed:
            if self.journal is not None:
                self.journal.write({"finish": gid,
                                    "records": [r.model_dump(mode="json") for r in records]})
            self._records[gid] = records
            self._changed.notify_all()

    def on_release(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the releasing thread) each time groups are released."""
        self._on_release.append(callback)

    def wake(self) -> None:
        """Wake the `wait_finished` callers (to look at their `stop` condition again)."""
        with self._changed:
            self._changed.notify_all()

    # -- the loop -----------------------------------------------------------------------------

    def release(self, gids: Iterable[str]) -> list[str]:
        """The window consumed these groups; returns those not released before."""
        with self._changed:
            new = [g for g in dict.fromkeys(gids) if g not in self._released]
            self._released.update(new)
        if new:
            for callback in self._on_release:
                callback()
        return new

    def settle(self, gid: str, trained: float, stale: int = 0) -> None:
        """The trainer is done with `gid`: it trained `trained` of its samples and dropped
        `stale` as too old. ValueError for a group settled before."""
        with self._changed:
            if gid in self._settled:
                raise ValueError(f"group {gid} was settled already")
            self._settled.add(gid)
            i = self._env[gid]
            self._settled_n[i] += 1
            self._trained[i] += trained
            self._stale[i] += stale

    def wait_finished(self, seen: int, timeout: float, stop: Callable[[], bool]) -> int:
        """Block until more than `seen` groups have finished, `stop()` holds (checked on each
        `wake`) or `timeout`; returns the number finished."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._records) != seen or stop(), timeout)
            return len(self._records)

    # -- resume -------------------------------------------------------------------------------

    def restore(self, journal: Journal, consumed: Iterable[str],
                settled: list[dict[str, float]] | None) -> list[str]:
        """A resumed run's ledger: every group the journal launched (in order) and finished,
        the checkpoint's `consumed` groups released and settled with its per-environment
        `settled` counts. Returns the groups launched and never finished (in flight at the
        crash), now finished with no records, for the caller to close and pass."""
        with self._changed:
            for gid, env in journal.launches:
                self._order.append(gid)
                self._env[gid] = self._index[env]
                self._launched[self._index[env]] += 1
            self._records.update({g: r for g, r in journal.finished.items() if g in self._env})
            done = set(consumed)
            self._released |= done
            self._settled |= done
            for i, counts in enumerate(settled or []):
                self._settled_n[i] = int(counts["settled"])
                self._trained[i] = float(counts["trained"])
                self._stale[i] = int(counts["stale"])
            stopped = [g for g in self._order if g not in self._records]
            for gid in stopped:  # finished now, with nothing to train: no longer running
                self._records[gid] = []
            return stopped

    def settled_counts(self) -> list[dict[str, float]]:
        """Per environment (in `envs` order): groups settled, samples trained and dropped as
        stale (a checkpoint's part of the ledger; the rest is in the journal)."""
        return [{"settled": c.settled, "trained": c.trained, "stale": c.stale}
                for c in self.counts()]

    def launched_by_env(self) -> list[int]:
        """Groups launched from each environment (in `envs` order)."""
        return [c.launched for c in self.counts()]

    def launched_tasks_by_env(self) -> list[list[str]]:
        """The task ids each environment launched groups on, in launch order."""
        with self._changed:
            out: list[list[str]] = [[] for _ in self.envs]
            for gid in self._order:
                out[self._env[gid]].append(self.task_of(gid))
            return out

    def task_of(self, gid: str) -> str:
        """The task id of `gid` (`launch` wrote it into the id: RUN:ENV:TASK:gNNNNNN)."""
        head = f"{self.run_id}:{self.envs[self._env[gid]]}:"
        return gid[len(head):].rsplit(":g", 1)[0]

    def task_rates(self, env: str, task_id: str, n: int) -> list[float]:
        """Solve rates of the last `n` finished groups of `task_id` (newest first): the
        share of samples resolved, env failures left out (a group with nothing else, skipped)."""
        with self._changed:
            i = self._index[env]
            rates: list[float] = []
            for gid in reversed(self._order):
                if len(rates) >= n:
                    break
                if self._env[gid] != i or gid not in self._records or \
                        self.task_of(gid) != task_id:
                    continue
                valid = [r for r in self._records[gid] if r.status != "env_failure"]
                if valid:
                    rates.append(sum(bool(r.resolved) for r in valid) / len(valid))
            return rates

    # -- reads --------------------------------------------------------------------------------

    @property
    def finished(self) -> int:
        """Groups finished so far."""
        with self._changed:
            return len(self._records)

    @property
    def launched(self) -> int:
        """Groups launched so far."""
        with self._changed:
            return len(self._order)

    def outstanding(self) -> int:
        """Groups launched and not yet released (the producer's buffer holds these)."""
        with self._changed:
            return len(self._order) - len(self._released)

    def running(self) -> int:
        """Groups launched and not yet finished."""
        with self._changed:
            return len(self._order) - len(self._records)

    def snapshot(self) -> tuple[list[str], set[str]]:
        """(launch order, ids of finished groups), consistent with each other."""
        with self._changed:
            return list(self._order), set(self._records)

    def env_of(self, gid: str) -> str:
        return self.envs[self._env[gid]]

    def records(self, gid: str) -> list[RolloutRecord]:
        """A finished group's rollout records (none for a group not finished)."""
        with self._changed:
            return list(self._records.get(gid, []))

    def counts(self) -> list[EnvCounts]:
        """Each environment's counts, in `envs` order, consistent with each other."""
        with self._changed:
            return [EnvCounts(*c) for c in zip(self._launched, self._settled_n, self._trained,
                                               self._stale, strict=True)]

    def shares(self) -> list[float]:
        """Each environment's share of the samples trained so far."""
        counts = self.counts()
        total = sum(c.trained for c in counts)
        return [c.trained / total if total else 0.0 for c in counts]
