"""From finished groups to training sequences: filters, then advantages (items 2 and 3).

A `TrainSequence` is one segment of one session: parallel per-token arrays whose lengths are
checked when it is built. Shapes: every list is over the segment's tokens (T).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from envhub.trainer.advantages import (
    batch_normalize,
    composite_reward,
    group_advantages,
    runner_events,
    token_advantages,
    truncated,
)
from envhub.trainer.config import TrainerConfig
from envhub.trainer.filters import DropCounts, filter_group
from envhub.trainer.source import Group


@dataclass
class TrainSequence:
    """One linear token sequence to train on (a segment of a session)."""

    session_id: str
    group_id: str
    segment: int
    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantages: list[float]
    reward: float = 0.0  # composite reward of the session
    sample_advantage: float = 0.0  # its GRPO advantage (before per-turn terms)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        lens = (len(self.loss_mask), len(self.rollout_logprobs), len(self.advantages))
        assert all(x == n for x in lens), (
            f"{self.session_id}/{self.segment}: {n} tokens vs mask/logprobs/advantages {lens}")

    @property
    def n_loss_tokens(self) -> int:
        # The first token has no context to be predicted from, so it can never carry loss.
        return sum(self.loss_mask[1:])


@dataclass(frozen=True)
class GroupFate:
    """What a step made of one group: its samples trained (0: the group was dropped) and
    those dropped as stale."""

    trained: int
    stale: int


@dataclass
class Batch:
    """What one trainer step consumes, plus what the filters removed on the way."""

    sequences: list[TrainSequence]
    drops: DropCounts = field(default_factory=DropCounts)
    n_groups: int = 0
    rewards: list[float] = field(default_factory=list)  # composite reward per valid sample
    fates: dict[str, GroupFate] = field(default_factory=dict)  # by group id
    truncated: Counter[str] = field(default_factory=Counter)  # masked / penalised samples

    def metrics(self) -> dict[str, float]:
        out = self.drops.metrics()
        out["batch/groups"] = float(self.n_groups)
        out["batch/sequences"] = float(len(self.sequences))
        out.update({f"truncated/{k}": float(v) for k, v in self.truncated.items()})
        if self.rewards:
            out["reward/mean"] = sum(self.rewards) / len(self.rewards)
        return out


def build_batch(groups: list[Group], config: TrainerConfig, trainer_version: int) -> Batch:
    """Filter each group, compute advantages, flatten segments into sequences."""
    batch = Batch(sequences=[])
    for group in groups:
        for t in group.trajectories:  # ignored by the composite (advantages.runner_events)
            batch.drops.rewards["not_from_runner"] += len(t.rewards) - len(runner_events(t))
        stale_before = batch.drops.samples["stale"]
        kept = filter_group(group, config.filters, trainer_version, batch.drops)
        stale = batch.drops.samples["stale"] - stale_before
        batch.fates[group.group_id] = GroupFate(0, stale)  # until it is trained
        if kept is None:
            continue
        a_sample, turn_terms = group_advantages(kept.samples, config.advantages)
        valid = kept.samples[:kept.n_valid]
        batch.rewards += [composite_reward(t, config.advantages) for t in valid]
        sequences: list[TrainSequence] = []
        masked_truncated = config.advantages.truncated == "mask"
        if config.advantages.truncated != "keep":
            cut = sum(truncated(t) for t in valid)
            if cut:
                batch.truncated["masked" if masked_truncated else "penalised"] += cut
        for t, a, terms in zip(kept.samples, a_sample, turn_terms, strict=True):
            if masked_truncated and truncated(t):
                continue  # DAPO's overlong filtering: its reward is in the baseline, no loss
            main = t.main_chain() if config.filters.chains == "main" else None
            for seg in t.segments:
                if not any(seg.loss_mask):
                    continue  # a segment with nothing sampled contributes nothing
                if main is not None and seg.chain != main:
                    batch.drops.sequences["side_chain"] += 1
                    continue
                sequences.append(TrainSequence(
                    session_id=t.session.id, group_id=group.group_id, segment=seg.index,
                    token_ids=list(seg.token_ids), loss_mask=list(seg.loss_mask),
                    rollout_logprobs=list(seg.logprobs),
                    advantages=token_advantages(t, seg, a, terms),
                    reward=composite_reward(t, config.advantages), sample_advantage=a))
        if config.filters.drop_no_signal and not any(
                x for seq in sequences for x, m in zip(seq.advantages, seq.loss_mask,
                                                       strict=True) if m):
            batch.drops.groups["no_signal"] += 1  # every advantage 0: no policy gradient
            continue
        batch.n_groups += 1
        batch.sequences += sequences
        batch.fates[group.group_id] = GroupFate(kept.n_valid, stale)
    if config.advantages.estimator == "reinforce_pp":
        normalized = batch_normalize([q.advantages for q in batch.sequences],
                                     [q.loss_mask for q in batch.sequences], config.advantages)
        for q, adv in zip(batch.sequences, normalized, strict=True):
            q.advantages = adv
    return batch
