"""GRPO and per-turn reward-to-go against hand-computed values."""

from __future__ import annotations

import math

import pytest

from envhub.sdk.types import RewardEvent
from envhub.trainer.advantages import grpo, rewards_before_turn, token_turns
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


def test_rewards_before_each_turn() -> None:
    # Turn-level process rewards: turn 0 -> -0.2, turn 1 -> -0.1.
    t = trajectory("a", reward=1.0, turn_rewards={0: -0.2, 1: -0.1})
    assert rewards_before_turn(t, AdvantageConfig()) == pytest.approx({0: 0.0, 1: -0.2})
    assert token_turns(t, t.segments[0]) == [0, 0, 0, 0, 0, 1, 1]


def test_reward_to_go_counts_each_reward_once() -> None:
    # Sample a: outcome 1, process -0.2 at turn 0 and -0.1 at turn 1: R_a = 0.7.
    # Sample b: outcome 0, nothing else: R_b = 0. Baseline mean 0.35 (no std).
    # a, turn 0: G = 0.7 (everything is still ahead)            -> 0.7 - 0.35 = 0.35
    # a, turn 1: G = 0.7 - (-0.2) = 0.9 (turn 0's penalty is past) -> 0.9 - 0.35 = 0.55
    # b, both turns: G = 0                                       -> -0.35
    ts = [trajectory("a", reward=1.0, index=0, turn_rewards={0: -0.2, 1: -0.1}),
          trajectory("b", reward=0.0, index=1)]
    cfg = TrainerConfig(advantages=AdvantageConfig(normalize_std=False))
    a, b = build_batch([Group("g", ts)], cfg, 0).sequences
    assert a.advantages == pytest.approx([0, 0, 0, 0.35, 0.35, 0, 0.55])
    assert b.advantages == pytest.approx([0, 0, 0, -0.35, -0.35, 0, -0.35])
    # With the std: R = (0.7, 0), std 0.35, so everything above is divided by 0.35 (+eps).
    cfg = TrainerConfig(advantages=AdvantageConfig(eps=1e-12))
    a, b = build_batch([Group("g", ts)], cfg, 0).sequences
    assert a.advantages == pytest.approx([0, 0, 0, 1.0, 1.0, 0, 0.55 / 0.35])
    assert b.advantages == pytest.approx([0, 0, 0, -1.0, -1.0, 0, -1.0])
    # turn_coef 0: plain GRPO, the whole sample's reward on every token
    cfg = TrainerConfig(advantages=AdvantageConfig(normalize_std=False, turn_coef=0.0))
    a, _ = build_batch([Group("g", ts)], cfg, 0).sequences
    assert a.advantages == pytest.approx([0, 0, 0, 0.35, 0.35, 0, 0.35])


def test_stored_reward_to_go_events_are_not_added_again() -> None:
    # Environments store derived `reward_to_go` events (outcome included): the trainer
    # recomputes from the components, so they change nothing.
    plain = [trajectory("a", reward=1.0, index=0, turn_rewards={0: -0.2}),
             trajectory("b", reward=0.0, index=1)]
    with_rtg = [trajectory("a", reward=1.0, index=0, turn_rewards={0: -0.2}),
                trajectory("b", reward=0.0, index=1)]
    with_rtg[0].rewards += [RewardEvent(kind="reward_to_go", value=0.8, seq=0),
                            RewardEvent(kind="reward_to_go", value=1.0, seq=1)]
    with_rtg[1].rewards += [RewardEvent(kind="reward_to_go", value=0.0, seq=s) for s in (0, 1)]
    cfg = TrainerConfig()
    expected = [s.advantages for s in build_batch([Group("g", plain)], cfg, 0).sequences]
    got = [s.advantages for s in build_batch([Group("g", with_rtg)], cfg, 0).sequences]
    assert got == expected


def test_inconsistent_turns_raise_with_the_cause() -> None:
    t = trajectory("a", turn_rewards={0: 1.0})
    t.turns[1].prompt_delta_ids.append(99)  # turns now cover 8 tokens, the segment 7
    with pytest.raises(BadTrajectory, match="turns cover 8 tokens"):
        token_turns(t, t.segments[0])
