"""Errors every component raises the same way. Each component keeps its own `errors.py` for
its own failures and re-exports these."""

from __future__ import annotations


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message is the install line.

    An ImportError, so code that already treats a missing module as "feature unavailable"
    keeps working."""

    def __init__(self, what: str, extra: str):
        super().__init__(f"{what} needs an optional dependency: pip install 'envhub[{extra}]'")
