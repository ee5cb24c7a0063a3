"""Which task each new group samples: passes over each environment's training tasks in a fresh
seeded order, environments interleaved by their weights (`arith=3 swe-task=1`), and the
held-out tasks evaluation uses (never trained on)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from envhub.envs.environment import Task


@dataclass(frozen=True)
class EnvTasks:
    """One environment of a training run: its reference, weight and task split."""

    ref: str
    name: str
    weight: float
    train: list[Task]
    heldout: list[Task]


def split_tasks(tasks: list[Task], limit: int | None, heldout: int) -> tuple[list[Task],
                                                                              list[Task]]:
    """(training tasks, held-out tasks): the last `heldout` tasks are held out, the first
    `limit` of the others are trained on (all of them without a limit). ValueError (with the
    fix) when nothing would be left to train on."""
    if heldout and heldout >= len(tasks):
        raise ValueError(f"--eval-tasks {heldout}: the environment has only {len(tasks)} tasks; "
                         "hold out fewer (or --eval-every 0 to train on all of them)")
    train, held = (tasks[:-heldout], tasks[-heldout:]) if heldout else (tasks, [])
    return train[:limit], held


def task_stream(envs: list[EnvTasks], seed: int) -> Iterator[tuple[EnvTasks, Task]]:
    """Endless (environment, task) pairs. Each environment walks passes over its training
    tasks, each pass in a fresh order from its own seeded generator; environments take turns at
    their weighted pace (the one furthest behind its share goes next, ties in listed order).
    With one environment the order is `task_schedule`'s, flattened."""
    orders = [_passes(e.train, random.Random(seed)) for e in envs]
    progress = [0.0] * len(envs)
    while True:
        i = min(range(len(envs)), key=lambda j: (progress[j], j))
        progress[i] += 1.0 / envs[i].weight
        yield envs[i], next(orders[i])


def _passes(tasks: list[Task], rng: random.Random) -> Iterator[Task]:
    while True:
        epoch = list(tasks)
        rng.shuffle(epoch)
        yield from epoch
