"""Where envhub keeps what it builds once per machine ($ENVHUB_CACHE, default
~/.cache/envhub): image build locks and packages, SWE build contexts, search indexes, judge
verdicts."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder (ENVHUB_CACHE overrides), created if missing."""
    root = Path(os.environ.get("ENVHUB_CACHE", Path.home() / ".cache" / "envhub"))
    root.mkdir(parents=True, exist_ok=True)
    return root
