"""Composite rewards (DESIGN.md, Rewards): every component is its own reward event so the trainer
can recompute the total with other weights.

Components, weights from the manifest's `[rewards]` table (a missing weight is 0: the event is
still stored, it just does not count):
- outcome: the verifier's score in [0, 1].
- process: one event per penalised turn signal (malformed_tool_call from the gateway; unknown_tool,
  tool_error, language_mixing from the agent), value -signal.value; `process.<signal>` overrides
  the `process` weight for one signal.
- time: completion time relative to the group's median, for resolved samples only (a fast
  failure must not earn a bonus): (median - t) / max(median, 1 s) clipped to [-1, 1] (the 1 s
  floor keeps sub-second jitter from being rewarded); 0 for others and for groups with fewer
  than two resolved samples.
- reward_to_go (per turn seq): the weighted sum of every component from that turn on (gamma 1).
  Derived, so `Trajectory.total_reward` skips it.
"""

from __future__ import annotations

import re
import statistics
import unicodedata
from dataclasses import dataclass, field

from envhub.sdk.types import RewardEvent, Signal

TIME_SCALE_FLOOR_S = 1.0
PROCESS_SIGNALS = ("malformed_tool_call", "unknown_tool", "tool_error", "language_mixing")


@dataclass
class SampleScore:
    """What scoring needs to know about one finished (status done) rollout."""

    outcome: float
    resolved: bool
    duration_s: float  # the agent's working time, not setup or grading
    signals: list[Signal] = field(default_factory=list)
    turn_seqs: list[int] = field(default_factory=list)
    verdict_info: dict = field(default_factory=dict)


def weight_of(weights: dict[str, float], kind: str, name: str = "") -> float:
    if name and f"{kind}.{name}" in weights:
        return float(weights[f"{kind}.{name}"])
    return float(weights.get(kind, 0.0))


def outcome_event(sample: SampleScore, weights: dict[str, float]) -> RewardEvent:
    value = min(1.0, max(0.0, float(sample.outcome)))
    return RewardEvent(kind="outcome", value=value, name="verifier",
                       weight=weight_of(weights, "outcome"),
                       info={"resolved": sample.resolved, **sample.verdict_info})


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


def score_group(samples: list[SampleScore], weights: dict[str, float]) -> list[list[RewardEvent]]:
    """Reward events for each sample of one group (same order)."""
    times = time_values(samples)
    scored = []
    for sample, t in zip(samples, times, strict=True):
        last = max(sample.turn_seqs) if sample.turn_seqs else None
        events = [outcome_event(sample, weights)]
        events += process_events(sample.signals, weights, last)
        events.append(RewardEvent(kind="time", value=t, name="completion_time",
                                  weight=weight_of(weights, "time"),
                                  info={"duration_s": round(sample.duration_s, 3)}))
        events += reward_to_go(events, sample.turn_seqs)
        scored.append(events)
    return scored


def components(events: list[RewardEvent]) -> dict[str, float]:
    """Unweighted sums per kind (for tables and results files); `total` is the composite."""
    out = {"outcome": 0.0, "process": 0.0, "time": 0.0}
    for e in events:
        if e.kind in out:
            out[e.kind] += e.value
    out["total"] = composite(events)
    return out


# --- language mixing -----------------------------------------------------------------------

_CODE_RE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
_SCRIPT_GROUPS = {
    "CJK": "cjk", "HIRAGANA": "cjk", "KATAKANA": "cjk", "HANGUL": "hangul", "LATIN": "latin",
    "CYRILLIC": "cyrillic", "GREEK": "greek", "ARABIC": "arabic", "HEBREW": "hebrew",
    "DEVANAGARI": "devanagari", "THAI": "thai",
}


def scripts_of(text: str) -> dict[str, int]:
    """Letter counts per writing system, ignoring code spans (identifiers are not language)."""
    counts: dict[str, int] = {}
    for ch in _CODE_RE.sub(" ", text):
        if not ch.isalpha():
            continue
        first = unicodedata.name(ch, "").split(" ")[0]
        script = _SCRIPT_GROUPS.get(first, "other")
        counts[script] = counts.get(script, 0) + 1
    return counts


def mixes_languages(text: str, min_letters: int = 4, min_share: float = 0.1) -> bool:
    """True when a second writing system holds at least `min_letters` letters and `min_share`
    of all letters: the model switched language mid-answer (e.g. English with Chinese)."""
    counts = scripts_of(text)
    total = sum(counts.values())
    if len(counts) < 2 or total == 0:
        return False
    minority = sorted(counts.values(), reverse=True)[1]
    return minority >= min_letters and minority / total >= min_share
