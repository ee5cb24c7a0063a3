"""Which samples of a group are trained on (issue 7, item 2).

Per sample, in this order (the first reason that applies is the one counted):
  open                 the session is not closed (should not happen in a finished group)
  env_failure          infrastructure failed; excluded so a fake 0 does not bias the group
  no_trainable_tokens  no token with loss_mask 1 (text-only turns, empty rollout)
  stale                trainer_version - w0 > tau, w0 = oldest weight version of a sampled token
Per group: with n valid samples out of an expected size G, n == G trains as is; n > G/2 pads
the group back to G by repeating valid samples in order (valid[0], valid[1], ...); otherwise
the whole group is dropped (`group_under_half`) and its valid samples are counted as
`group_dropped_samples`. Every drop is a count in `DropCounts`, reported as metrics.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from envhub.sdk.types import SessionStatus, Trajectory
from envhub.trainer.config import FilterConfig
from envhub.trainer.source import Group


@dataclass
class DropCounts:
    """Samples (and groups) removed, by reason; `padded` counts repeated samples added."""

    samples: Counter[str] = field(default_factory=Counter)
    groups: Counter[str] = field(default_factory=Counter)
    sequences: Counter[str] = field(default_factory=Counter)  # segments left out of a sample
    rewards: Counter[str] = field(default_factory=Counter)  # reward events ignored
    padded: int = 0

    def metrics(self) -> dict[str, float]:
        out = {f"drop/{k}": float(v) for k, v in self.samples.items()}
        out.update({f"drop_rewards/{k}": float(v) for k, v in self.rewards.items()})
        out.update({f"drop_groups/{k}": float(v) for k, v in self.groups.items()})
        out.update({f"drop_sequences/{k}": float(v) for k, v in self.sequences.items()})
        out["pad/samples"] = float(self.padded)
        return out


@dataclass
class FilteredGroup:
    """A group ready for advantages: `samples` has the full group size (padding included)."""

    group_id: str
    samples: list[Trajectory]
    n_valid: int


def oldest_version(t: Trajectory) -> int | None:
    """w0: the smallest weight version among sampled tokens (None: no sampled token)."""
    versions = [v for seg in t.segments for v, m in
                zip(seg.weight_versions, seg.loss_mask, strict=True) if m and v >= 0]
    return min(versions) if versions else None


def drop_reason(t: Trajectory, config: FilterConfig, trainer_version: int) -> str | None:
    """Why this sample must not be trained on, or None when it is valid."""
    if t.status == SessionStatus.open:
        return "open"
    if config.exclude_env_failures and t.status == SessionStatus.env_failure:
        return "env_failure"
    if not any(m for seg in t.segments for m in seg.loss_mask):
        return "no_trainable_tokens"
    w0 = oldest_version(t)
    if config.tau is not None and w0 is not None and trainer_version - w0 > config.tau:
        return "stale"
    return None


def filter_group(group: Group, config: FilterConfig, trainer_version: int,
                 drops: DropCounts) -> FilteredGroup | None:
    """Apply the per-sample filters and the pad-or-drop rule; record every drop in `drops`."""
    size = config.group_size or len(group.trajectories)
    valid: list[Trajectory] = []
    for t in group.trajectories:
        reason = drop_reason(t, config, trainer_version)
        if reason is None:
            valid.append(t)
        else:
            drops.samples[reason] += 1
    if len(valid) >= size:
        return FilteredGroup(group.group_id, valid, len(valid))
    # "More than half": strictly, so 4 of 8 is dropped and 5 of 8 is padded.
    if 2 * len(valid) <= size:
        drops.groups["group_under_half"] += 1
        drops.samples["group_dropped_samples"] += len(valid)
        return None
    padding = [valid[i % len(valid)] for i in range(size - len(valid))]
    drops.padded += len(padding)
    return FilteredGroup(group.group_id, valid + padding, len(valid))
