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
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from envhub.envs.environment import Task
from envhub.orchestrator.training.ledger import EnvCounts, GroupLedger


@dataclass(frozen=True)
class EnvTasks:
    """One environment of a training run: its reference, weight and task split."""

    ref: str
    name: str
    weight: float
    train: list[Task]
    heldout: list[Task]
    stratify: str | None = None  # a key of Task.data whose values each pass interleaves
    # its manifest's [rewards] table: the trainer's composite weights for its sessions
    reward_weights: dict[str, float] = field(default_factory=dict)
    agent: str = "tool"  # the --agent value its rollouts run (envs.agents.agent_for)
    folder: str = ""  # its package folder (run.json's digest)


def split_tasks(tasks: list[Task], limit: int | None, heldout: int,
                stratify: str | None = None) -> tuple[list[Task], list[Task]]:
    """(training tasks, held-out tasks): the last `heldout` tasks are held out, the first
    `limit` of the others are trained on (all of them without a limit). With `stratify` (a key
    of the tasks' data) each stratum gives its last tasks, as many as its share of `heldout`
    (largest remainders), so the held-out set has the training mix. ValueError (with the fix)
    when nothing would be left to train on."""
    if heldout and heldout >= len(tasks):
        raise ValueError(f"--eval-tasks {heldout}: the environment has only {len(tasks)} tasks; "
                         "hold out fewer (or --eval-every 0 to train on all of them)")
    if not heldout:
        return tasks[:limit], []
    if not stratify:
        return tasks[:-heldout][:limit], tasks[-heldout:]
    strata = _strata(tasks, stratify)
    quota = {k: heldout * len(v) / len(tasks) for k, v in strata.items()}
    counts = {k: int(q) for k, q in quota.items()}
    for k in sorted(quota, key=lambda k: counts[k] - quota[k])[:heldout - sum(counts.values())]:
        counts[k] += 1
    held_ids = {t.id for k, v in strata.items() for t in v[len(v) - counts[k]:]}
    return ([t for t in tasks if t.id not in held_ids][:limit],
            [t for t in tasks if t.id in held_ids])


def task_stream(envs: list[EnvTasks], seed: int, mix: LaunchMix | None = None,
                launched: Sequence[Sequence[str]] | None = None,
                admit: DifficultyFilter | None = None) -> Iterator[tuple[EnvTasks, Task]]:
    """Endless (environment, task) pairs. Each environment walks passes over its training
    tasks, each pass in a fresh order from its own seeded generator; environments take turns as
    `mix` says (default: at their weighted pace, `by_share`). With one environment the order
    is `task_schedule`'s, flattened. `admit` (the difficulty filter) may pass over a task when
    its turn comes: the environment's next task is taken instead (at most one pass of them).
    `launched` (a resumed run): the task ids each environment launched groups on, in order;
    the stream goes on where those left it (each environment's order advanced to its last
    launched task, whatever the filter passed over on the way; a static mix's turns past
    them)."""
    mix = mix or LaunchMix([e.weight for e in envs])
    orders = [_passes(e.train, random.Random(seed), e.stratify) for e in envs]
    if launched:
        for env, order, ids in zip(envs, orders, launched, strict=True):
            for task_id in ids:
                for _ in range(2 * len(env.train)):  # to it, within two passes
                    if next(order).id == task_id:
                        break
        mix.advance(sum(len(ids) for ids in launched))
    while True:
        i = mix.next()
        task = next(orders[i])
        for _ in range(len(envs[i].train) - 1):
            if admit is None or admit.admits(envs[i].name, task):
                break
            task = next(orders[i])
        yield envs[i], task


class DifficultyFilter:
    """An online difficulty filter (in the spirit of prime-rl's difficulty pools): a task
    whose last `window` finished groups were all solved by every sample (rate 1) or by none
    (rate 0) has no signal to give, so when its turn comes it is launched only with
    probability `floor` (> 0, so it returns and its record is looked at again); otherwise the
    stream takes the next task. A task with fewer than `window` finished groups is always
    launched. Each draw is seeded by (seed, groups launched so far, task id), so a run and
    its resume draw alike; `passed` counts the tasks passed over (the step rows' filter
    count)."""

    def __init__(self, ledger: GroupLedger, window: int, floor: float, seed: int) -> None:
        if window < 1 or not 0 < floor <= 1:
            raise ValueError("the difficulty filter needs window >= 1 and 0 < floor <= 1")
        self.ledger, self.window, self.floor, self.seed = ledger, window, floor, seed
        self.passed = 0

    def admits(self, env: str, task: Task) -> bool:
        rates = self.ledger.task_rates(env, task.id, self.window)
        if len(rates) < self.window or not (all(r == 1 for r in rates)
                                            or all(r == 0 for r in rates)):
            return True
        if random.Random(f"{self.seed}:{self.ledger.launched}:{task.id}").random() < self.floor:
            return True
        self.passed += 1
        return False


class LaunchMix:
    """Which environment the next group is launched from.

    Static (the default): at the weights' pace (`by_share`), whatever becomes of the groups.

    Dynamic: the weights are targets for the shares of *trained* samples, read from the run's
    `GroupLedger`. A group launched from environment i is expected to yield y_i trained
    samples, y_i observed from its groups the trainer is done with (trained samples per settled
    group; failures, stale samples and no-signal groups yield nothing), starting from a prior
    of `prior` full groups. Environment i's expected trained samples are T_i + y_i * P_i (T_i
    trained so far, P_i groups launched and not yet settled), and the next launch goes to the
    environment furthest below its share of the expected total, ties to the lower index. So an
    environment whose samples are dropped more often is launched more often, and one whose
    groups take 10x longer has 10x more of them in flight: its launches keep pace with the
    target however slow it is.

    The mix keeps no counts of its own: the producer records each launch in the ledger, the
    loop each settled group."""

    def __init__(self, weights: Sequence[float], ledger: GroupLedger | None = None,
                 dynamic: bool = False, prior_groups: float = 2.0) -> None:
        if dynamic and ledger is None:
            raise ValueError("a dynamic launch mix reads the run's GroupLedger: pass it")
        total = sum(weights)
        self.targets = [w / total for w in weights]
        self.ledger, self.dynamic, self.prior = ledger, dynamic, prior_groups
        self._static = by_share(list(weights))
        self._lock = threading.Lock()

    def advance(self, n: int) -> None:
        """Past the first `n` launches (a resumed run): a static mix's turns move on; a
        dynamic one reads the ledger, which holds them already."""
        with self._lock:
            if not self.dynamic:
                for _ in range(n):
                    next(self._static)

    def next(self) -> int:
        with self._lock:
            if not self.dynamic:
                return next(self._static)
            assert self.ledger is not None
            counts, k = self.ledger.counts(), self.ledger.k
            return min(range(len(self.targets)), key=lambda j: (
                (expected(counts[j], k, self.prior) + 0.5 * yield_of(counts[j], k, self.prior))
                / self.targets[j], j))


def yield_of(c: EnvCounts, k: int, prior: float) -> float:
    """Trained samples per settled group (a prior of `prior` full groups of `k`)."""
    return (c.trained + prior * k) / (c.settled + prior)


def expected(c: EnvCounts, k: int, prior: float) -> float:
    """Samples trained so far plus those expected of the groups not yet settled."""
    return c.trained + yield_of(c, k, prior) * (c.launched - c.settled)


def by_share(shares: Sequence[float], counts: Sequence[int] | None = None) -> Iterator[int]:
    """Indices into `shares`, each taken at the pace of its share: the next is the one least
    far through, (taken + 1/2) / share, ties to the lower index. Any stretch holds each index
    within about one of its share. With `counts`, index j is taken at most counts[j] times
    (the stream ends when all are)."""
    taken = [0] * len(shares)
    while True:
        open_ = [j for j in range(len(shares)) if counts is None or taken[j] < counts[j]]
        if not open_:
            return
        i = min(open_, key=lambda j: ((taken[j] + 0.5) / shares[j], j))
        taken[i] += 1
        yield i


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
    strata = _strata(order, key).values()
    queues = [iter(q) for q in strata]
    sizes = [len(q) for q in strata]
    return [next(queues[i]) for i in by_share(sizes, sizes)]


def _strata(tasks: list[Task], key: str) -> dict[str, list[Task]]:
    """`tasks` grouped by `data[key]` (a task without it is its own kind, ""), each group in
    the tasks' order, groups in order of first appearance."""
    strata: dict[str, list[Task]] = {}
    for task in tasks:
        strata.setdefault(str(task.data.get(key, "")), []).append(task)
    return strata
