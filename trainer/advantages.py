"""Advantages on the composite reward, with per-turn reward-to-go.

The estimator (REINFORCE with reward-to-go and a baseline). For sample i of a group of K
with composite rewards R (padded repeats included, so the group is treated as full), the
tokens sampled at turn t get

    A_{i,t} = (G_{i,t} - b_i) / s
    G_{i,t} = R_i - turn_coef * sum of the weighted turn-level events of i with seq < t

with, per `AdvantageConfig.estimator`:
    grpo          b_i = mean_j R_j, s = std_j R_j + eps   (GRPO, Shao et al. 2024;
                  `normalize_std` off: s = 1, Dr.GRPO, Liu et al. 2025)
    rloo          b_i = (sum_j R_j - R_i) / (K - 1), s = 1 (RLOO, Ahmadian et al. 2024)
    reinforce_pp  b_i = mean_j R_j (0 without `group_baseline`), s = 1, then every loss
                  token's A of the batch is normalised by the mean and std over all loss
                  tokens of the batch (REINFORCE++, Hu et al. 2025)

so every reward counts exactly once in each token's advantage: rewards without a turn (the
outcome, the completion-time reward) and turn-level rewards (process penalties) at or after
turn t, while a penalty earned at an earlier turn is not charged to later actions. At the first
turn G = R, so without turn-level events (or with `turn_coef` 0) this is plain GRPO. The std is
the population std of R (all-equal rewards and singletons give 0, never NaN).

Explicit `reward_to_go` events that environments store are derived display values: the
trainer recomputes G from the stored components with its own weights and ignores them (adding
them would count the outcome a second time). Tokens outside the loss mask get advantage 0.

Which events count, and how much: only events the runner wrote (`writer == "runner"`, stamped
by the gateway on the admin-key route; any other is ignored, and `build_batch` counts it), each
weighted by its environment's manifest table (`AdvantageConfig.env_reward_weights`, else
`reward_weights`), never by the event's own `weight`.
"""

from __future__ import annotations

import math

from envhub.sdk.types import RUNNER, RewardEvent, Segment, Trajectory, manifest_weight
from envhub.trainer.config import AdvantageConfig
from envhub.trainer.errors import BadTrajectory


def baseline_and_scale(rewards: list[float], normalize_std: bool = True,
                       eps: float = 1e-6) -> tuple[float, float]:
    """The group's mean reward and the divisor of its advantages (std + eps, or 1)."""
    mean = sum(rewards) / len(rewards)
    if not normalize_std:
        return mean, 1.0
    return mean, math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) + eps


def grpo(rewards: list[float], normalize_std: bool = True, eps: float = 1e-6) -> list[float]:
    """Group-relative advantages of one group's rewards."""
    if not rewards:
        return []
    mean, scale = baseline_and_scale(rewards, normalize_std, eps)
    return [(r - mean) / scale for r in rewards]


def runner_events(t: Trajectory) -> list[RewardEvent]:
    """The reward events of `t` its runner wrote (the only ones the trainer uses)."""
    return [e for e in t.rewards if e.writer == RUNNER]


def reward_weights(t: Trajectory, config: AdvantageConfig) -> dict[str, float]:
    """The manifest table that weighs `t`'s events: its environment's, else the default."""
    return config.env_reward_weights.get(t.session.env or "", config.reward_weights)


def truncated(t: Trajectory) -> bool:
    """Cut by the length limit: its last turn ended with finish_reason 'length'."""
    return bool(t.turns) and max(t.turns, key=lambda x: x.seq).finish_reason == "length"


def composite_reward(t: Trajectory, config: AdvantageConfig) -> float:
    """The weighted sum of the runner's events (minus `overlong_penalty` for a truncated
    sample under truncated=penalty)."""
    weights = reward_weights(t, config)
    total = sum(manifest_weight(e, weights) * e.value
                for e in runner_events(t) if e.kind != "reward_to_go")
    if config.truncated == "penalty" and truncated(t):
        total -= config.overlong_penalty
    return total


def rewards_before_turn(t: Trajectory, config: AdvantageConfig) -> dict[int, float]:
    """Per turn seq: the weighted turn-level rewards of `t` earned at earlier turns (empty
    when `t` has no turn-level reward)."""
    events = [e for e in runner_events(t) if e.seq is not None and e.kind != "reward_to_go"]
    if not events:
        return {}
    weights = reward_weights(t, config)
    weighted = [(e.seq, manifest_weight(e, weights) * e.value) for e in events]
    return {turn.seq: sum(v for s, v in weighted if s is not None and s < turn.seq)
            for turn in t.turns}


def token_turns(t: Trajectory, segment: Segment) -> list[int]:
    """Turn seq of every token of `segment`, rebuilt from the turns' deltas and completions."""
    seqs: list[int] = []
    for turn in sorted((x for x in t.turns if x.segment == segment.index), key=lambda x: x.seq):
        seqs += [turn.seq] * (len(turn.prompt_delta_ids) + len(turn.completion_ids))
    if len(seqs) != len(segment.token_ids):
        raise BadTrajectory(
            f"session {t.session.id} segment {segment.index}: its turns cover {len(seqs)} "
            f"tokens but the segment has {len(segment.token_ids)}; per-turn rewards need "
            "segments that are exactly the concatenation of their turns (gateway export bug?)")
    return seqs


def token_advantages(t: Trajectory, segment: Segment, a_sample: float,
                     turn_term: dict[int, float]) -> list[float]:
    """Per-token advantages of one segment: sample advantage + turn term, 0 off the mask."""
    if not turn_term:
        return [a_sample if m else 0.0 for m in segment.loss_mask]
    turns = token_turns(t, segment)
    return [(a_sample + turn_term.get(s, 0.0)) if m else 0.0
            for m, s in zip(segment.loss_mask, turns, strict=True)]


def baselines_and_scale(rewards: list[float], config: AdvantageConfig
                        ) -> tuple[list[float], float]:
    """Each sample's baseline b_i and the group's divisor of (G - b_i), per estimator:
    grpo: the group mean and std + eps (1 without normalize_std: Dr.GRPO); rloo: the mean of
    the other samples' rewards, 1 (a singleton: its own reward, so A = 0); reinforce_pp: the
    group mean (0 without group_baseline), 1: its scale is the batch's (`batch_normalize`)."""
    if config.estimator == "rloo":
        k, total = len(rewards), sum(rewards)
        return [(total - r) / (k - 1) if k > 1 else r for r in rewards], 1.0
    if config.estimator == "reinforce_pp":
        mean = sum(rewards) / len(rewards) if config.group_baseline else 0.0
        return [mean] * len(rewards), 1.0
    mean, scale = baseline_and_scale(rewards, config.normalize_std, config.eps)
    return [mean] * len(rewards), scale


def group_advantages(samples: list[Trajectory], config: AdvantageConfig
                     ) -> tuple[list[float], list[dict[int, float]]]:
    """Per sample: its first-turn advantage A_i and the per-turn correction {seq: A_{i,t} -
    A_i} (empty when the sample has no turn-level reward)."""
    rewards = [composite_reward(t, config) for t in samples]
    if not rewards:
        return [], []
    baselines, scale = baselines_and_scale(rewards, config)
    terms = [{s: -config.turn_coef * v / scale for s, v in rewards_before_turn(t, config).items()}
             for t in samples]
    return [(r - b) / scale for r, b in zip(rewards, baselines, strict=True)], terms


def batch_normalize(advantages: list[list[float]], masks: list[list[int]],
                    config: AdvantageConfig) -> list[list[float]]:
    """REINFORCE++'s global normalisation: every loss token's advantage minus the mean over
    all loss tokens of the batch (the tokens trained: a sequence's first never is), divided
    by their population std + eps (only the mean with normalize_std off); tokens off the mask
    stay 0."""
    values = [a for adv, mask in zip(advantages, masks, strict=True)
              for a, m in zip(adv[1:], mask[1:], strict=True) if m]  # token 0 is never trained
    if not values:
        return advantages
    mean = sum(values) / len(values)
    scale = (math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) + config.eps
             if config.normalize_std else 1.0)
    return [[(a - mean) / scale if m else 0.0 for a, m in zip(adv, mask, strict=True)]
            for adv, mask in zip(advantages, masks, strict=True)]
