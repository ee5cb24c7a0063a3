"""Per-step rows of OUT/metrics.jsonl: the trained groups' rollouts (overall and per
environment), what every filter removed or added, and the trainer's own metrics."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from envhub.orchestrator.groups.results import RolloutRecord

# Filter effects always reported (0 when nothing happened), besides the trainer's own
# `trainer/drop/<reason>` counts: stale samples, env failures, padding, no-signal groups.
FILTERS = {"filter/stale": "trainer/drop/stale", "filter/env_failure": "trainer/drop/env_failure",
           "filter/padded": "trainer/pad/samples",
           "filter/no_signal_groups": "trainer/drop_groups/no_signal",
           "filter/under_half_groups": "trainer/drop_groups/group_under_half"}


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.fmean(xs) if xs else 0.0


def rollout_metrics(records: list[RolloutRecord], prefix: str = "") -> dict[str, float]:
    """Mean reward, outcome and solved rate over `done` rollouts (failures are counted, never
    averaged in as zeros), and the counts."""
    done = [r for r in records if r.status == "done"]
    return {f"{prefix}reward_mean": _mean(r.components.get("total", 0.0) for r in done),
            f"{prefix}outcome_mean": _mean(r.outcome or 0.0 for r in done),
            f"{prefix}resolved_rate": _mean(1.0 if r.resolved else 0.0 for r in done),
            f"{prefix}rollouts": len(records),
            f"{prefix}env_failures": sum(r.status == "env_failure" for r in records)}


def step_metrics(by_env: dict[str, list[RolloutRecord]], stats: dict[str, Any]
                 ) -> dict[str, Any]:
    """The rollout part (all environments, then `env/<name>/...` each) and the filter part of
    a step's row, from the records of the groups it trained on and `Trainer.step`'s stats."""
    row: dict[str, Any] = rollout_metrics([r for rs in by_env.values() for r in rs])
    if len(by_env) > 1:
        for name, records in sorted(by_env.items()):
            row.update(rollout_metrics(records, f"env/{name}/"))
    trainer = {f"trainer/{k}": v for k, v in stats.items() if isinstance(v, (int, float))}
    row.update(trainer)
    row.update({name: trainer.get(key, 0.0) for name, key in FILTERS.items()})
    return row
