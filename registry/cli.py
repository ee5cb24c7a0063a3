"""`envhub` commands owned by the registry component."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this component's commands to the top-level app."""
