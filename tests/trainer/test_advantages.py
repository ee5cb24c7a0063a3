"""GRPO and per-turn reward-to-go against hand-computed values."""

from __future__ import annotations

import math

import pytest

from envhub.trainer.advantages import grpo, token_turns, turn_rewards_to_go
from envhub.trainer.batch import build_batch
from envhub.trainer.config import AdvantageConfig, TrainerConfig
from envhub.trainer.errors import BadTrajectory
from envhub.trainer.source import Group
from tests.trainer.handmade import trajectory


def test_grpo_mean_and_std() -> None:
    # rewards 0, 1, 2, 3: mean 1.5, population std sqrt(1.25)
    a = grpo([0.0, 1.0, 2.0, 3.0], normalize_std=True, eps=0.0)
    s = math.sqrt(1.25)
    assert a == pytest.approx([-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s])
    assert grpo([0.0, 1.0, 2.0, 3.0], normalize_std=False) == [-1.5, -0.5, 0.5, 1.5]
    # all-equal rewards and singletons: zero advantage, never NaN
    assert grpo([1.0, 1.0]) == [0.0, 0.0] and grpo([5.0]) == [0.0]


def test_only_sampled_tokens_carry_advantage() -> None:
    ts = [trajectory("a", reward=1.0, index=0), trajectory("b", reward=0.0, index=1)]
    cfg = TrainerConfig(advantages=AdvantageConfig(normalize_std=False))
    batch = build_batch([Group("g", ts)], cfg, 0)
    a, b = batch.sequences
    # mask [0,0,0,1,1,0,1], advantages +-0.5 exactly on the sampled tokens
    assert a.advantages == [0, 0, 0, 0.5, 0.5, 0, 0.5]
    assert b.advantages == [0, 0, 0, -0.5, -0.5, 0, -0.5]


def test_reward_to_go_per_turn() -> None:
    # Turn-level process rewards: turn 0 -> -0.2, turn 1 -> -0.1.
    t = trajectory("a", reward=1.0, turn_rewards={0: -0.2, 1: -0.1})
    assert turn_rewards_to_go(t, AdvantageConfig()) == pytest.approx({0: -0.3, 1: -0.1})
    assert token_turns(t, t.segments[0]) == [0, 0, 0, 0, 0, 1, 1]


def test_reward_to_go_enters_token_advantages() -> None:
    # Sample a: composite 1 - 0.2 - 0.1 = 0.7, G = {0: -0.3, 1: -0.1}
    # Sample b: composite 0, no turn events -> G = {0: 0, 1: 0}
    # GRPO (no std): a +0.35, b -0.35. Mean G over the 4 turns = -0.1.
    # a: turn 0 -> 0.35 + (-0.3 + 0.1) = 0.15, turn 1 -> 0.35 + 0 = 0.35
    # b: turn 0 -> -0.35 + 0.1 = -0.25,        turn 1 -> -0.35 + 0.1 = -0.25
    ts = [trajectory("a", reward=1.0, index=0, turn_rewards={0: -0.2, 1: -0.1}),
          trajectory("b", reward=0.0, index=1)]
    cfg = TrainerConfig(advantages=AdvantageConfig(normalize_std=False))
    a, b = build_batch([Group("g", ts)], cfg, 0).sequences
    assert a.advantages == pytest.approx([0, 0, 0, 0.15, 0.15, 0, 0.35])
    assert b.advantages == pytest.approx([0, 0, 0, -0.25, -0.25, 0, -0.25])


def test_inconsistent_turns_raise_with_the_cause() -> None:
    t = trajectory("a", turn_rewards={0: 1.0})
    t.turns[1].prompt_delta_ids.append(99)  # turns now cover 8 tokens, the segment 7
    with pytest.raises(BadTrajectory, match="turns cover 8 tokens"):
        token_turns(t, t.segments[0])
