"""Task allocation across environments by weight, and interleaving of their groups."""

from __future__ import annotations

import pytest

from envhub.orchestrator.groups.config import EnvChoice
from envhub.orchestrator.groups.plan import RolloutKey, allocate, interleave


@pytest.mark.parametrize("total,weights,available,expected", [
    (None, [1, 1], [5, 7], [5, 7]),  # no -n: every task
    (4, [3, 1], [10, 10], [3, 1]),
    (10, [1, 1], [2, 50], [2, 8]),  # capped env's share goes to the others
    (5, [1, 1, 1], [10, 10, 10], [2, 2, 1]),
    (100, [1, 1], [3, 4], [3, 4]),
    (3, [1, 1], [0, 9], [0, 3]),
])
def test_allocate(total, weights, available, expected):
    got = allocate(total, weights, available)
    assert got == expected
    assert sum(got) == min(total or sum(available), sum(available))


def test_interleave_follows_the_weights():
    order = interleave([["a1", "a2", "a3", "a4"], ["b1", "b2"]], [2.0, 1.0])  # type: ignore[list-item]
    assert order[:3].count("b1") == 1 and sorted(order) == sorted(["a1", "a2", "a3", "a4", "b1",
                                                                   "b2"])
    assert [x for x in order if x.startswith("a")] == ["a1", "a2", "a3", "a4"]


def test_env_choice_parsing_and_safe_file_names():
    assert EnvChoice.parse("arith=2.5") == EnvChoice(ref="arith", weight=2.5)
    assert EnvChoice.parse("./my-env") == EnvChoice(ref="./my-env", weight=1.0)
    assert EnvChoice.parse("me/env@1.0.0").ref == "me/env@1.0.0"
    key = RolloutKey("swe-task", "owner/repo#12 ../x", 3)
    assert "/" not in key.filename and key.filename.endswith("__3.json")
    assert RolloutKey("e", "a/b", 0).filename != RolloutKey("e", "a_b", 0).filename
