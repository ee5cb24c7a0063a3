"""Wire types shared by every component (DESIGN.md, Contracts).

Token data is explicit: parallel arrays whose lengths are checked when the object is built.
Shape suffixes are not used here because every array is one-dimensional over tokens (T).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator


class SessionStatus(str, Enum):
    open = "open"
    done = "done"
    env_failure = "env_failure"
    agent_error = "agent_error"


CMKind = Literal["truncate", "summarize", "rewrite", "fork", "reset", "preamble_change"]
RewardKind = Literal["outcome", "process", "time", "custom", "reward_to_go"]


class SessionInfo(BaseModel):
    """One rollout. `api_key` is shown only to whoever created the session."""

    id: str
    group_id: str | None = None
    task_id: str | None = None
    env: str | None = None
    sample_index: int = 0
    status: SessionStatus = SessionStatus.open
    reason: str | None = None
    created_at: float = 0.0
    closed_at: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    api_key: str | None = None
    base_url: str | None = None


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: str  # JSON text exactly as the model produced it


class Turn(BaseModel):
    """One model call. `prompt_ids` is filled only in exports (storage keeps deltas)."""

    seq: int
    segment: int
    prompt_delta_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    weight_version: int
    finish_reason: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    latency_ms: float = 0.0
    instance: str = ""
    trainable: bool = True
    created_at: float = 0.0
    prompt_ids: list[int] | None = None
    # Text-only turns (hosted models through litellm) keep text instead of ids.
    completion_text: str | None = None
    # The model name the client asked for (e.g. claude-*), before the gateway's alias table
    # mapped it to the served model; None in pools written before it was recorded.
    requested_model: str | None = None
    # Engine forward passes that produced the completion (the embedded engine reports them;
    # len(completion_ids) / forwards > 1 when speculative decoding accepted drafts); None when
    # the engine does not say.
    forwards: int | None = None
    # The conversation this turn belongs to: the seq of its first turn. A session holds several
    # when a client makes side calls (a title request, sub-agents) beside its main loop.
    chain: int = 0
    # A side chain's parent: the chain whose history this chain's first request copied under
    # its own system prompt and tools (a helper or sub-agent call); None for a root chain.
    parent_chain: int | None = None

    @model_validator(mode="after")
    def _lengths(self) -> Turn:
        if len(self.completion_ids) != len(self.completion_logprobs):
            raise ValueError(
                f"turn {self.seq}: {len(self.completion_ids)} completion ids but "
                f"{len(self.completion_logprobs)} logprobs"
            )
        return self


class Segment(BaseModel):
    """A linear token sequence: concatenation of its turns' (delta + completion).

    loss_mask is 1 exactly on sampled tokens; logprobs are the rollout logprobs there and 0.0
    elsewhere; weight_versions is the producing version on sampled tokens and -1 elsewhere.
    """

    index: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    turn_seqs: list[int] = Field(default_factory=list)
    chain: int = 0  # the conversation (Turn.chain) the segment belongs to

    @model_validator(mode="after")
    def _lengths(self) -> Segment:
        n = len(self.token_ids)
        lens = (len(self.loss_mask), len(self.logprobs), len(self.weight_versions))
        if any(x != n for x in lens):
            raise ValueError(f"segment {self.index}: array lengths differ: {n} ids vs {lens}")
        return self


class CMAction(BaseModel):
    """A context-management action: the request did not extend the session's token history."""

    kind: CMKind
    source: Literal["detected", "declared"] = "detected"
    seq: int | None = None  # first turn of the new segment (None: declared, not yet used)
    segment: int | None = None  # the segment this action starts
    from_seq: int | None = None  # the turn whose history was departed from
    removed: list[list[int]] = Field(default_factory=list)  # [start, end) message ranges dropped
    added: list[list[int]] = Field(default_factory=list)  # [start, end) ranges new in the request
    tokens_before: int = 0
    tokens_after: int = 0
    info: dict[str, Any] = Field(default_factory=dict)


RUNNER = "runner"  # RewardEvent.writer of an event the gateway took from the admin key


class RewardEvent(BaseModel):
    """One reward component. `weight` is a record of what the runner applied; the composite
    takes weights from the environment's manifest, never from the event (it could say 1000).
    `writer` is stamped by the gateway when it stores the event (`"runner"`: the admin key
    wrote it); whatever a client sends there is overwritten, and the trainer keeps only runner
    events."""

    kind: RewardKind
    value: float
    name: str = ""
    seq: int | None = None
    weight: float | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    writer: str | None = None


def manifest_weight(event: RewardEvent, weights: dict[str, float] | None) -> float:
    """The weight of `event` under a manifest's `[rewards]` table: `<key>.<name>`, then `<key>`
    (the component's manifest key, recorded by the runner in `info["component"]`, else the
    event's kind), else 0. With no table (None or empty) every kind weighs 1.0."""
    if not weights:
        return 1.0
    key = event.info.get("component")
    key = key if isinstance(key, str) and key else event.kind
    if event.name and f"{key}.{event.name}" in weights:
        return float(weights[f"{key}.{event.name}"])
    return float(weights.get(key, 0.0))


class Signal(BaseModel):
    """A process signal (malformed tool call, tool error, ...) attached to a turn."""

    name: str
    seq: int | None = None
    value: float = 1.0
    info: dict[str, Any] = Field(default_factory=dict)


class Trajectory(BaseModel):
    session: SessionInfo
    segments: list[Segment]
    turns: list[Turn]
    cm_actions: list[CMAction] = Field(default_factory=list)
    rewards: list[RewardEvent] = Field(default_factory=list)
    signals: list[Signal] = Field(default_factory=list)
    status: SessionStatus = SessionStatus.open

    def main_chain(self) -> int:
        """The session's main conversation: the root chain with the most turns (the earliest on
        a tie). Side calls of a CLI (a title request, a sub-agent, a side chain) are the
        others."""
        counts: dict[int, int] = {}
        for turn in self.turns:
            if turn.parent_chain is None:
                counts[turn.chain] = counts.get(turn.chain, 0) + 1
        return min(counts, key=lambda c: (-counts[c], c)) if counts else 0

    def total_reward(self, weights: dict[str, float] | None = None) -> float:
        """Composite of the reward events (reward_to_go, a derived value, left out), each
        weighted by the manifest table `weights` (`manifest_weight`; none: 1.0 each), never by
        its own `weight`."""
        return sum(manifest_weight(e, weights) * e.value
                   for e in self.rewards if e.kind != "reward_to_go")
