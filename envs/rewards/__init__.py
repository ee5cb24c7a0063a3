"""Composite rewards (DESIGN.md, Rewards): every component is its own reward event so the
trainer can recompute the total with other weights.

Components come from one table, name -> 'module:Class' (`RewardComponent`, base.py). The
built-ins (builtin.py: outcome, process, time) always score; a manifest's `[rewards]` gives
their weights (a missing weight is 0: the events are stored, they just do not count) and may
list components of its own, by dotted path, beside them:

    [rewards]
    outcome = 1.0
    "process.tool_error" = 0.5                                   # one signal's weight
    brevity = { weight = 0.2, component = "rewards:Brevity" }     # module of the package
    # or component = "my_pkg.rewards:Brevity"; naming a built-in replaces it
    [rewards.judge]                                              # a model judge (judge/)
    weight = 0.5
    rubric = "..."

reward_to_go (per turn seq) is derived from all the others: the weighted sum of every event
from that turn on (gamma 1), so `Trajectory.total_reward` skips it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from envhub.envs.rewards.base import RewardComponent, SampleScore, UsesGateway, weight_of
from envhub.envs.rewards.builtin import (
    PROCESS_SIGNALS,
    TIME_SCALE_FLOOR_S,
    process_events,
    time_values,
)
from envhub.envs.rewards.language import mixes_languages, scripts_of
from envhub.sdk.plugins import load_object
from envhub.sdk.types import RewardEvent

REWARDS: dict[str, str] = {
    "outcome": "envhub.envs.rewards.builtin:Outcome",
    "process": "envhub.envs.rewards.builtin:Process",
    "time": "envhub.envs.rewards.builtin:CompletionTime",
}

__all__ = [
    "PROCESS_SIGNALS", "REWARDS", "TIME_SCALE_FLOOR_S", "RewardComponent", "SampleScore",
    "UsesGateway",
    "components", "composite", "make_components", "mixes_languages", "process_events",
    "reward_to_go", "score_group", "scripts_of", "time_values", "weight_of",
]


def make_components(custom: Mapping[str, str] | None = None,
                    load: Callable[[str], Any] | None = None) -> dict[str, RewardComponent]:
    """Manifest key -> component: the built-ins, then `custom` (key -> dotted path, loaded
    with `load`, default a plain import). Raises LookupError naming a path that fails."""
    load = load or (lambda path: load_object(path, {}, "reward component"))
    found = {name: load_object(name, REWARDS, "reward component") for name in REWARDS}
    found.update({key: load(path) for key, path in (custom or {}).items()})
    return {key: obj() if isinstance(obj, type) else obj for key, obj in found.items()}


def score_group(samples: list[SampleScore], weights: dict[str, float],
                parts: Mapping[str, RewardComponent] | None = None
                ) -> list[list[RewardEvent]]:
    """Reward events for each sample of one group (same order): every component's, then the
    per-turn reward-to-go."""
    scored: list[list[RewardEvent]] = [[] for _ in samples]
    for key, component in (parts or make_components()).items():
        per_sample = component.score(samples, weights)
        if len(per_sample) != len(samples):
            raise ValueError(f"reward component {key!r} returned {len(per_sample)} event lists "
                             f"for a group of {len(samples)}; return one list per sample")
        for events, new in zip(scored, per_sample, strict=True):
            for e in new:  # the manifest's weight, whatever the component set (it could be 1000)
                e.info = {**e.info, "component": key}
                e.weight = weight_of(weights, key, e.name)
            events += new
    for sample, events in zip(samples, scored, strict=True):
        events += reward_to_go(events, sample.turn_seqs)
    return scored


def reward_to_go(events: list[RewardEvent], turn_seqs: list[int]) -> list[RewardEvent]:
    """Per turn: weighted sum of the events at or after it; turn-less events count everywhere."""
    out = []
    for seq in sorted(set(turn_seqs)):
        total = sum(
            (e.weight or 0.0) * e.value for e in events
            if e.kind != "reward_to_go" and (e.seq is None or e.seq >= seq)
        )
        out.append(RewardEvent(kind="reward_to_go", value=total, seq=seq, weight=0.0))
    return out


def composite(events: list[RewardEvent]) -> float:
    """The final reward: weighted sum of all components except the derived reward-to-go."""
    return sum((e.weight or 0.0) * e.value for e in events if e.kind != "reward_to_go")


def components(events: list[RewardEvent]) -> dict[str, float]:
    """Unweighted sums per kind (for tables and results files); `total` is the composite."""
    out = {"outcome": 0.0, "process": 0.0, "time": 0.0}
    for e in events:
        if e.kind != "reward_to_go":
            out[e.kind] = out.get(e.kind, 0.0) + e.value
    out["total"] = composite(events)
    return out
