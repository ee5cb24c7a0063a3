"""The reward-component protocol and what components see of a rollout."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from envhub.sdk.types import RewardEvent, Signal


@dataclass
class SampleScore:
    """What scoring needs to know about one finished (status done) rollout."""

    outcome: float
    resolved: bool
    duration_s: float  # the agent's working time, not setup or grading
    signals: list[Signal] = field(default_factory=list)
    turn_seqs: list[int] = field(default_factory=list)
    verdict_info: dict = field(default_factory=dict)
    # for model judges: the task's instruction and row, and the agent's declared output
    instruction: str = ""
    task_data: dict = field(default_factory=dict)
    output: str | None = None


class RewardComponent(Protocol):
    """One part of the composite reward, listed in a manifest's `[rewards]`.

    `score` sees the whole group (some components are relative to it: time) and returns each
    sample's events, in the group's order. An event left without a `weight` gets the weight
    its manifest entry gives; the trainer can recompute the total with other weights, because
    every event is stored on its own.
    """

    def score(self, group: list[SampleScore], weights: dict[str, float]
              ) -> list[list[RewardEvent]]: ...


def weight_of(weights: dict[str, float], kind: str, name: str = "") -> float:
    """`kind.name`'s weight if the manifest sets one, else `kind`'s, else 0."""
    if name and f"{kind}.{name}" in weights:
        return float(weights[f"{kind}.{name}"])
    return float(weights.get(kind, 0.0))


@runtime_checkable
class UsesGateway(Protocol):
    """Optional second face of a component that calls a model (the judge): before scoring, the
    runner hands it the run's gateway, its default endpoint."""

    def use_gateway(self, url: str, admin_key: str | None) -> None: ...
