"""The built-in reward components (DESIGN.md, Rewards): outcome, process, time.

- outcome: the verifier's score, clamped to [0, 1].
- process: one event per penalised turn signal (malformed_tool_call, undeclared_tool and
  invalid_tool_arguments from the gateway; tool_error, language_mixing from the agent;
  grading_tampered from a verifier that caught the agent's code forging test results;
  ungradable_output from the runner when what the agent left could not be graded),
  value -signal.value;
  `process.<signal>` overrides the `process` weight for one signal (and penalises a signal
  not in the default list).
- time: completion time relative to the group's median, for resolved samples only (a fast
  failure must not earn a bonus): (median - t) / max(median, 1 s) clipped to [-1, 1] (the 1 s
  floor keeps sub-second jitter from being rewarded); 0 for others and for groups with fewer
  than two resolved samples.
"""

from __future__ import annotations

import statistics

from envhub.envs.environment import UNGRADABLE
from envhub.envs.rewards.base import SampleScore, weight_of
from envhub.sdk.types import RewardEvent, Signal

TIME_SCALE_FLOOR_S = 1.0
# unknown_tool: undeclared_tool's old name, in pools recorded before the gateway stopped
# passing such calls through; re-scoring them keeps its penalty
PROCESS_SIGNALS = ("malformed_tool_call", "undeclared_tool", "invalid_tool_arguments",
                   "unknown_tool", "tool_error", "language_mixing", "grading_tampered",
                   UNGRADABLE)


class Outcome:
    def score(self, group: list[SampleScore], weights: dict[str, float]
              ) -> list[list[RewardEvent]]:
        return [[RewardEvent(kind="outcome", value=min(1.0, max(0.0, float(s.outcome))),
                             name="verifier", weight=weight_of(weights, "outcome"),
                             info={"resolved": s.resolved, **s.verdict_info})] for s in group]


class Process:
    def score(self, group: list[SampleScore], weights: dict[str, float]
              ) -> list[list[RewardEvent]]:
        return [process_events(s.signals, weights, max(s.turn_seqs) if s.turn_seqs else None)
                for s in group]


class CompletionTime:
    def score(self, group: list[SampleScore], weights: dict[str, float]
              ) -> list[list[RewardEvent]]:
        return [[RewardEvent(kind="time", value=t, name="completion_time",
                             weight=weight_of(weights, "time"),
                             info={"duration_s": round(s.duration_s, 3)})]
                for s, t in zip(group, time_values(group), strict=True)]


def process_events(signals: list[Signal], weights: dict[str, float],
                   last_seq: int | None) -> list[RewardEvent]:
    """One penalty event per process signal; a signal without a turn lands on the last turn."""
    events = []
    for s in signals:
        if s.name not in PROCESS_SIGNALS and f"process.{s.name}" not in weights:
            continue
        events.append(RewardEvent(
            kind="process", name=s.name, value=-abs(float(s.value)),
            seq=s.seq if s.seq is not None else last_seq,
            weight=weight_of(weights, "process", s.name), info=dict(s.info),
        ))
    return events


def time_values(samples: list[SampleScore]) -> list[float]:
    """Per sample: (median - t) / max(median, 1 s) over the group's resolved samples, clipped
    to [-1, 1]."""
    resolved = [s.duration_s for s in samples if s.resolved and s.duration_s > 0]
    if len(resolved) < 2:
        return [0.0] * len(samples)
    median = statistics.median(resolved)
    scale = max(median, TIME_SCALE_FLOOR_S)
    return [
        max(-1.0, min(1.0, (median - s.duration_s) / scale)) if s.resolved else 0.0
        for s in samples
    ]
