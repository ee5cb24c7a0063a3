"""pytest for sandboxes without one: the local sandbox runs the host's /usr/bin/python3, which
usually has no pytest, so the grader hands it envhub's own (a runtime dependency of envhub).

The copy is the pytest distribution and everything it requires, transitively, as installed
for this interpreter (pytest 8.4+ needs pygments; a hard-coded list went stale once already).
Markers are ignored on purpose: the sandbox's python3 may be older than ours and need tomli or
exceptiongroup; whatever is not installed here is skipped. Only pure-Python wheels work this
way, which pytest and its requirements are.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from envhub.envs.environment import EnvFailure

_cache: Path | None = None


def requirement_closure(root: str) -> list[metadata.Distribution]:
    """`root`'s installed distribution and every installed one it requires, transitively
    (extras left out)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [root]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or "extra" not in str(req.marker):
                todo.append(req.name)
    return list(found.values())


def _copy(dist: metadata.Distribution, target: Path) -> None:
    for rel in dist.files or []:
        # console scripts live outside site-packages ("../../bin/pytest"); bytecode is rebuilt
        if rel.parts[0] == ".." or "__pycache__" in rel.parts:
            continue
        source = Path(str(dist.locate_file(rel)))
        if source.is_file():
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)


def host_pylib() -> Path:
    """A folder holding this interpreter's pytest and its requirements (PYTHONPATH-ready)."""
    global _cache
    if _cache is not None and _cache.is_dir():
        return _cache
    target = Path(tempfile.mkdtemp(prefix="envhub-pylib-"))
    atexit.register(shutil.rmtree, target, True)
    for dist in requirement_closure("pytest"):
        _copy(dist, target)
    if not (target / "pytest").is_dir():
        raise EnvFailure("the sandbox's python3 has no pytest and neither has envhub's "
                         "interpreter, although envhub depends on it: pip install 'pytest>=8' "
                         "in envhub's environment (or apt-get install python3-pytest)")
    _cache = target
    return target
