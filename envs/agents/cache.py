"""Install-once folders of the agent cache (pip libraries, npm trees): built aside, marked
complete, then renamed into place, so a failed or concurrent build never leaves half a folder."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = ".envhub-ok"


def cached_folder(final: Path, build: Callable[[Path], None], note: str) -> Path:
    """`final` if a complete build is there, else `build(work)` into a temporary folder beside
    it, marked (`note` in the marker) and renamed to `final`; another run's concurrent build of
    the same folder wins (its copy is kept). Errors of `build` propagate and leave nothing."""
    if (final / MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name.split('-')[0]}-", dir=final.parent))
    try:
        build(work)
        (work / MARKER).write_text(note)
        try:
            work.rename(final)
        except OSError:  # installed concurrently by another run: keep theirs
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final
