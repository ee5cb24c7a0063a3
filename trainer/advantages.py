"""Advantages (issue 7, item 3): GRPO on the composite reward plus per-turn reward-to-go.

For sample i of a group with composite rewards r (padded repeats included, so the group is
treated as full):   A_i = (r_i - mean(r)) / (std(r) + eps)   (std: population std, so a
group whose rewards are all equal, or a singleton, gets 0 instead of NaN; `normalize_std`
off gives r_i - mean(r)).
Turn-level rewards (events with a turn `seq`) add, on the tokens of turn t,
    turn_coef * (G_t - mean of G over every turn of the group),
where G_t is the explicit `reward_to_go` event for turn t if there is one, else the weighted
sum of turn-level events with seq >= t (undiscounted reward-to-go). Tokens outside the loss
mask get advantage 0: only sampled tokens carry loss.
"""

from __future__ import annotations

import math

from envhub.sdk.types import Segment, Trajectory
from envhub.trainer.config import AdvantageConfig
from envhub.trainer.errors import BadTrajectory


def grpo(rewards: list[float], normalize_std: bool = True, eps: float = 1e-6) -> list[float]:
    """Group-relative advantages of one group's rewards."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centered = [r - mean for r in rewards]
    if not normalize_std:
        return centered
    std = math.sqrt(sum(c * c for c in centered) / len(rewards))
    return [c / (std + eps) for c in centered]


def composite_reward(t: Trajectory, config: AdvantageConfig) -> float:
    return t.total_reward(config.reward_weights)


def turn_rewards_to_go(t: Trajectory, config: AdvantageConfig) -> dict[int, float]:
    """G_t per turn seq (empty when the trajectory has no turn-level reward)."""
    explicit = {e.seq: e.value for e in t.rewards if e.kind == "reward_to_go" and e.seq is not None}
    events = [e for e in t.rewards if e.seq is not None and e.kind != "reward_to_go"]
    if not explicit and not events:
        return {}
    out: dict[int, float] = {}
    for turn in t.turns:
        if turn.seq in explicit:
            out[turn.seq] = explicit[turn.seq]
            continue
        out[turn.seq] = sum(
            (e.weight if e.weight is not None else config.reward_weights.get(e.kind, 1.0)) * e.value
            for e in events if e.seq is not None and e.seq >= turn.seq
        )
    return out


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


def group_advantages(samples: list[Trajectory], config: AdvantageConfig
                     ) -> tuple[list[float], list[dict[int, float]]]:
    """Sample advantages and, per sample, the centred turn term {seq: value} (may be empty)."""
    a = grpo([composite_reward(t, config) for t in samples], config.normalize_std, config.eps)
    rtg = [turn_rewards_to_go(t, config) for t in samples]
    if any(rtg):
        # A sample without turn-level events has G_t = 0 on each of its turns, so it still
        # takes part in the group's baseline.
        rtg = [per or {turn.seq: 0.0 for turn in t.turns} for per, t in
               zip(rtg, samples, strict=True)]
    values = [v for per in rtg for v in per.values()]
    if not values:
        return a, [{} for _ in samples]
    mean = sum(values) / len(values)
    terms = [{s: config.turn_coef * (v - mean) for s, v in per.items()} for per in rtg]
    return a, terms
