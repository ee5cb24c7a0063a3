"""Which task each new group samples: passes over each environment's training tasks in a fresh
seeded order, environments interleaved by their weights (`arith=3 swe-task=1`), and the
held-out tasks evaluation uses (never trained on).

An environment whose manifest names a `[tasks] stratify` field (arith: `family`) has each pass
ordered so that the field's values are interleaved by their share: every stretch of the stream
holds the environment's mix of problem kinds. Measured on arith (496 training tasks, seed 0,
two passes): without it a 10-step window (80 groups) drew between 18% and 46% word problems,
the family the bundled model never solves, so its mean reward moved by up to ~0.15 with the
draw alone; with it, between 31% and 33% (each family within 1.2 tasks of its share in any
stretch)."""

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
    stratify: str | None = None  # a key of Task.data whose values each pass interleaves


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
    orders = [_passes(e.train, random.Random(seed), e.stratify) for e in envs]
    progress = [0.0] * len(envs)
    while True:
        i = min(range(len(envs)), key=lambda j: (progress[j], j))
        progress[i] += 1.0 / envs[i].weight
        yield envs[i], next(orders[i])


def _passes(tasks: list[Task], rng: random.Random, stratify: str | None) -> Iterator[Task]:
    while True:
        epoch = list(tasks)
        rng.shuffle(epoch)
        yield from (interleave_strata(epoch, stratify) if stratify else epoch)


def interleave_strata(order: list[Task], key: str) -> list[Task]:
    """`order`'s tasks with their strata (tasks alike in `data[key]`; a task without it is
    its own kind, "") interleaved by share: each stratum keeps its order from `order`, and the
    next task comes from the stratum least far through (taken + 1/2) / size, ties to the one
    first seen in `order`. Any stretch of the result holds each stratum within about one
    task of its share."""
    strata: dict[str, list[Task]] = {}
    for task in order:
        strata.setdefault(str(task.data.get(key, "")), []).append(task)
    queues = list(strata.values())
    taken = [0] * len(queues)
    out: list[Task] = []
    for _ in order:
        i = min((j for j, q in enumerate(queues) if taken[j] < len(q)),
                key=lambda j: ((taken[j] + 0.5) / len(queues[j]), j))
        out.append(queues[i][taken[i]])
        taken[i] += 1
    return out
