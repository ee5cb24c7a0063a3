"""LaunchMix: which environment the next group is launched from (orchestrator/training/tasks.py).
Simulated producers and trainers with exact counts: no timing involved."""

from __future__ import annotations

import itertools

from envhub.orchestrator.training.tasks import LaunchMix, by_share

K = 4


def test_static_launches_at_the_weights_pace_whatever_becomes_of_the_groups():
    mix = LaunchMix([3, 1], k=K)
    order = [mix.next() for _ in range(40)]
    assert order == list(itertools.islice(by_share([3, 1]), 40))
    for i in order:
        mix.observe(i, K if i == 0 else 0)  # b's groups all dropped: static does not care
    assert mix.launched == [30, 10]


def train_with_losses(dynamic: bool, kept: dict[int, int], groups: int = 400) -> list[float]:
    """Each group is done with at once; environment i's groups keep kept[i] of K samples."""
    mix = LaunchMix([3, 1], dynamic=dynamic, k=K)
    for _ in range(groups):
        i = mix.next()
        mix.observe(i, kept[i])
    return mix.shares()


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
    """A producer keeping `buffer` groups launched and not yet trained; a's groups finish one
    tick after launch, b's `slow` ticks after; each tick the trainer takes up to `take` finished
    groups (any, oldest first: a greedy window) and counts their K samples as trained."""
    mix = LaunchMix([3, 1], dynamic=dynamic, k=K)
    running: list[tuple[int, int]] = []  # (finishes at tick, env)
    finished: list[int] = []
    for tick in range(ticks):
        while len(running) + len(finished) < buffer:
            i = mix.next()
            running.append((tick + (1 if i == 0 else slow), i))
        finished += [i for t, i in running if t <= tick]
        running = [(t, i) for t, i in running if t > tick]
        for i in finished[:take]:
            mix.observe(i, K)
        finished = finished[take:]
    return mix.shares(), mix.launched


def test_a_ten_times_slower_environment_keeps_its_share_of_trained_samples():
    """With every group trained, b 10x slower: its launches stay at 1 in 4, its groups in
    flight count toward its share, so neither mode starves or floods it; the trained share
    reaches the target in both. (What differs under slowness is staleness: those drops are
    the losses of the test above, which only the dynamic mix makes up for.)"""
    for dynamic in (False, True):
        shares, launched = simulate_slow(dynamic, slow=10)
        assert abs(shares[0] - 0.75) < 0.02, (dynamic, shares)
        assert abs(launched[0] / sum(launched) - 0.75) < 0.02


def test_the_mix_is_safe_across_threads():
    import threading

    mix = LaunchMix([1, 1], dynamic=True, k=K)

    def launch() -> None:
        for _ in range(500):
            mix.observe(mix.next(), K)

    threads = [threading.Thread(target=launch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(mix.launched) == 2000 and sum(mix.done) == 2000
    assert abs(mix.launched[0] - 1000) <= 2
