"""Scheduling policies (orchestrator/groups/scheduling.py) with hand-computed orders, and the
simulation bench's claim in miniature: on a long-tailed workload Seer's tail sits between FIFO's
and the oracle's."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from envhub.orchestrator.groups.scheduling import (
    FifoPolicy,
    Observation,
    SeerPolicy,
    make_policy,
)


def drain(policy) -> list[tuple[str, int]]:
    out = []
    while (nxt := policy.next()) is not None:
        out.append(nxt)
    return out


def test_fifo_is_arrival_order_then_index() -> None:
    p = FifoPolicy()
    p.add_group("a", 2)
    p.add_group("b", 3)
    assert drain(p) == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]


def test_seer_probes_first_then_unknown_then_longest_estimate() -> None:
    p = SeerPolicy(measure="tokens")
    for g, k in (("a", 3), ("b", 3), ("c", 2)):
        p.add_group(g, k)
    assert [p.next() for _ in range(3)] == [("a", 0), ("b", 0), ("c", 0)]  # one probe per group
    p.finished("a", 0, Observation(tokens=100))
    p.finished("c", 0, Observation(tokens=500))
    # b's probe still runs: its group goes first, then c (500 tokens) before a (100)
    assert drain(p) == [("b", 1), ("b", 2), ("c", 1), ("a", 1), ("a", 2)]


def test_seer_orders_by_the_measure_it_is_given() -> None:
    p = SeerPolicy(measure="seconds")
    p.add_group("a", 2)
    p.add_group("b", 2)
    p.next(), p.next()
    p.finished("a", 0, Observation(tokens=900, seconds=1.0))
    p.finished("b", 0, Observation(tokens=10, seconds=7.0))
    assert drain(p) == [("b", 1), ("a", 1)]  # by seconds, not tokens


def test_seer_estimate_is_the_longest_sample_seen_in_the_group() -> None:
    p = SeerPolicy(measure="tokens")
    p.add_group("a", 3)
    p.add_group("b", 3)
    p.next(), p.next()
    p.finished("a", 0, Observation(tokens=100))
    p.finished("b", 0, Observation(tokens=150))
    assert p.next() == ("b", 1)
    p.finished("b", 1, Observation(tokens=10))  # shorter: b's estimate stays 150
    assert drain(p) == [("b", 2), ("a", 1), ("a", 2)]
    assert p.estimate == {}  # every group fully started: nothing kept


def test_groups_arriving_later_join_the_order() -> None:
    p = SeerPolicy(measure="tokens")
    p.add_group("a", 3)
    assert p.next() == ("a", 0)
    p.finished("a", 0, Observation(tokens=50))
    p.add_group("b", 2)
    assert p.next() == ("b", 0)  # a newcomer's probe before anyone's rest
    p.finished("b", 0, Observation(tokens=80))
    assert drain(p) == [("b", 1), ("a", 1), ("a", 2)]


@pytest.mark.parametrize("name", ["fifo", "seer"])
def test_every_sample_starts_exactly_once(name: str) -> None:
    rng = random.Random(0)
    p = make_policy(name)
    sizes = {f"g{i}": rng.randint(1, 6) for i in range(20)}
    for g, k in sizes.items():
        p.add_group(g, k)
    started = []
    while (nxt := p.next()) is not None:
        started.append(nxt)
        if rng.random() < 0.7:
            p.finished(*nxt, Observation(tokens=rng.randint(1, 1000)))
    assert sorted(started) == sorted((g, i) for g, k in sizes.items() for i in range(k))


def test_seer_keeps_nothing_of_groups_fully_started() -> None:
    """A training loop adds groups forever: a group whose samples all started is forgotten
    (k = 1 included), and the order of the groups still being scheduled is kept."""
    p = SeerPolicy(measure="tokens")
    for i in range(50):
        p.add_group(f"old{i}", 1 + i % 2)
    started = drain(p)
    assert len(started) == 75 and p.estimate == {} and not p._rest and not p._order
    p.add_group("a", 2)
    p.add_group("b", 2)
    assert [p.next(), p.next()] == [("a", 0), ("b", 0)]
    p.finished("a", 0, Observation(tokens=5))
    p.finished("b", 0, Observation(tokens=5))
    assert drain(p) == [("a", 1), ("b", 1)]  # equal estimates: arrival order


def test_bad_input_is_refused_with_what_to_fix() -> None:
    p = SeerPolicy()
    p.add_group("a", 2)
    with pytest.raises(ValueError, match="added twice"):
        p.add_group("a", 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        p.add_group("b", 0)
    with pytest.raises(ValueError, match="fifo, seer"):
        make_policy("lifo")


def test_simulation_seer_tail_between_fifo_and_oracle() -> None:
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
    import bench_async_sim as sim

    args = sim.argparse.Namespace(groups=16, k=8, workers=8, sigma_group=1.0,
                                  sigma_sample=0.3, seeds=3)
    m = sim.compare(args)
    assert m["oracle"]["tail"] < m["seer"]["tail"] < m["fifo"]["tail"]
    assert m["oracle"]["makespan"] <= m["seer"]["makespan"] <= m["fifo"]["makespan"]
