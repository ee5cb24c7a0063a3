"""What the loop writes under OUT: metrics rows, a few sample rollouts of each step
(samples.jsonl) and the weight versions it keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def prune_weights(folder: Path, keep: int) -> None:
    """Delete all but the newest `keep` version folders (v000001, ...) under `folder`."""
    import shutil

    versions = sorted(p for p in folder.glob("v[0-9]*") if p.is_dir())
    for old in versions[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def append_row(out: Path, row: dict[str, Any]) -> None:
    append_rows(out / "metrics.jsonl", [row])


def append_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows appended to a JSONL file as one write."""
    if rows:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
