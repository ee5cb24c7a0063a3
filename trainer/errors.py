"""Trainer errors. Every message says what to change."""

from __future__ import annotations

# One MissingExtra for every component (an `as` import: an explicit re-export).
from envhub.sdk.errors import MissingExtra as MissingExtra


class TrainerError(Exception):
    """Base class: a trainer input or state problem the user can fix."""


class BadTrajectory(TrainerError):
    """A trajectory whose token arrays cannot be trained on (names the session and the fix)."""


class PeerFailed(TrainerError):
    """Rank 0 failed in a step all ranks take together (its weight push); it reports why."""


class SourceError(TrainerError):
    """The trajectory source (gateway HTTP API, store) answered badly or not at all."""


def require_torch() -> None:
    """Raise `MissingExtra` with the install line when torch is absent."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtra("the trainer", "train") from exc
