"""Trainer errors. Every message says what to change."""

from __future__ import annotations


class TrainerError(Exception):
    """Base class: a trainer input or state problem the user can fix."""


class BadTrajectory(TrainerError):
    """A trajectory whose token arrays cannot be trained on (names the session and the fix)."""


class SourceError(TrainerError):
    """The trajectory source (gateway HTTP API, store) answered badly or not at all."""


class MissingExtra(ImportError):
    def __init__(self, what: str, extra: str = "train"):
        super().__init__(f"{what} needs an optional dependency: pip install 'envhub[{extra}]'")


def require_torch() -> None:
    """Raise `MissingExtra` with the install line when torch is absent."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtra("the trainer", "train") from exc
