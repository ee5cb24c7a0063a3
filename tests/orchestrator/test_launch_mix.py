"""LaunchMix (orchestrator/training/tasks.py) over the run's GroupLedger
(orchestrator/training/ledger.py): which environment the next group is launched from.
Simulated producers and trainers with exact counts: no timing involved."""

from __future__ import annotations

import itertools

import pytest

from envhub.orchestrator.training.ledger import GroupLedger
from envhub.orchestrator.training.tasks import LaunchMix, by_share

K = 4
ENVS = ["a", "b"]


def launch(ledger: GroupLedger, mix: LaunchMix) -> tuple[int, str]:
    """What the producer does for each new group: ask the mix, record the launch."""
    i = mix.next()
    return i, ledger.launch(ENVS[i], "t")


def test_static_launches_at_the_weights_pace_whatever_becomes_of_the_groups():
    ledger = GroupLedger("r", ENVS, K)
    mix = LaunchMix([3, 1], ledger)
    launched = [launch(ledger, mix) for _ in range(40)]
    assert [i for i, _ in launched] == list(itertools.islice(by_share([3, 1]), 40))
    for i, gid in launched:
        ledger.finish(gid, [])
        ledger.settle(gid, K if i == 0 else 0)  # b's groups all dropped: static does not care
    assert [c.launched for c in ledger.counts()] == [30, 10]


def train_with_losses(dynamic: bool, kept: dict[int, int], groups: int = 400) -> list[float]:
    """Each group is settled at once; environment i's groups keep kept[i] of K samples."""
    ledger = GroupLedger("r", ENVS, K)
    mix = LaunchMix([3, 1], ledger, dynamic=dynamic)
    for _ in range(groups):
        i, gid = launch(ledger, mix)
        ledger.settle(gid, kept[i])
    return ledger.shares()


def test_dynamic_launches_more_of_an_environment_whose_samples_are_dropped():
    """b keeps 1 sample in 4 (failures, staleness, no-signal groups): static launches 3:1 and
    trains about 12:1; dynamic launches b more often and trains 3:1."""
    static = train_with_losses(False, {0: K, 1: 1})
    dynamic = train_with_losses(True, {0: K, 1: 1})
    assert abs(static[0] - 12 / 13) < 0.01
    assert abs(dynamic[0] - 0.75) < 0.01


def test_dynamic_equals_the_targets_when_nothing_is_lost():
    assert abs(train_with_losses(True, {0: K, 1: K})[0] - 0.75) < 0.01


def simulate_slow(dynamic: bool, slow: int, ticks: int = 2000, buffer: int = 8,
                  take: int = 1) -> tuple[list[float], list[int]]:
    """A producer keeping `buffer` groups launched and not yet released; a's groups finish one
    tick after launch, b's `slow` ticks after; each tick the trainer takes up to `take` finished
    groups (any, oldest first: a greedy window), releases them and settles their K samples as
    trained."""
    ledger = GroupLedger("r", ENVS, K)
    mix = LaunchMix([3, 1], ledger, dynamic=dynamic)
    running: list[tuple[int, str]] = []  # (finishes at tick, group)
    released: set[str] = set()
    for tick in range(ticks):
        while ledger.outstanding() < buffer:
            i, gid = launch(ledger, mix)
            running.append((tick + (1 if i == 0 else slow), gid))
        for gid in [g for t, g in running if t <= tick]:
            ledger.finish(gid, [])
        running = [(t, g) for t, g in running if t > tick]
        order, finished = ledger.snapshot()
        taken = [g for g in order if g in finished and g not in released][:take]
        for gid in ledger.release(taken):
            released.add(gid)
            ledger.settle(gid, K)
    return ledger.shares(), [c.launched for c in ledger.counts()]


def test_a_ten_times_slower_environment_keeps_its_share_of_trained_samples():
    """With every group trained, b 10x slower: its launches stay at 1 in 4, its groups in
    flight count toward its share, so neither mode starves or floods it; the trained share
    reaches the target in both. (What differs under slowness is staleness: those drops are
    the losses of the test above, which only the dynamic mix makes up for.)"""
    for dynamic in (False, True):
        shares, launched = simulate_slow(dynamic, slow=10)
        assert abs(shares[0] - 0.75) < 0.02, (dynamic, shares)
        assert abs(launched[0] / sum(launched) - 0.75) < 0.02


def test_the_ledger_is_safe_across_threads():
    """The producer's thread launches and finishes while the trainer's thread releases and
    settles: every count adds up, and the dynamic mix keeps 1:1."""
    import threading

    ledger = GroupLedger("r", ENVS, K)
    mix = LaunchMix([1, 1], ledger, dynamic=True)
    done: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        for _ in range(2000):
            _, gid = launch(ledger, mix)
            ledger.finish(gid, [])
        stop.set()
        ledger.wake()

    def consume() -> None:
        seen = 0
        while not (stop.is_set() and len(done) == 2000):
            seen = ledger.wait_finished(seen, 1.0, stop.is_set)
            order, finished = ledger.snapshot()
            for gid in ledger.release([g for g in order if g in finished]):
                ledger.settle(gid, K)
                done.append(gid)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    counts = ledger.counts()
    assert len(done) == len(set(done)) == 2000 and ledger.outstanding() == 0
    assert sum(c.launched for c in counts) == sum(c.settled for c in counts) == 2000
    assert sum(c.trained for c in counts) == 2000 * K
    assert abs(counts[0].launched - 1000) <= 2


def test_a_group_is_settled_once_and_a_dynamic_mix_needs_the_ledger():
    ledger = GroupLedger("r", ENVS, K)
    gid = ledger.launch("a", "t1")
    assert gid == "r:a:t1:g000000" and ledger.env_of(gid) == "a"
    assert (ledger.outstanding(), ledger.running()) == (1, 1)
    ledger.finish(gid, [])
    assert (ledger.outstanding(), ledger.running(), ledger.finished) == (1, 0, 1)
    assert ledger.release([gid, gid]) == [gid] and ledger.release([gid]) == []
    ledger.settle(gid, 3, stale=1)
    with pytest.raises(ValueError, match="settled already"):
        ledger.settle(gid, 3)
    assert ledger.counts()[0].stale == 1 and ledger.shares() == [1.0, 0.0]
    with pytest.raises(ValueError, match="GroupLedger"):
        LaunchMix([1, 1], dynamic=True)
