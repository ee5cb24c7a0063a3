"""An environment's declared Python dependencies: which are missing, and installing them
with pip into the running interpreter's environment (skipped when already satisfied)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from packaging.requirements import Requirement

from envhub.registry.errors import DependencyError


def unsatisfied(requirements: list[str]) -> list[str]:
    """The requirements the current environment does not meet (markers respected)."""
    missing = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            missing.append(text)
    return missing


def pip_install(requirements: list[str], python: str | None = None) -> None:
    """`python -m pip install REQS`; DependencyError (with pip's own words) on failure."""
    if not requirements:
        return
    cmd = [python or sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
           "--no-input", *requirements]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-1500:]
        raise DependencyError(
            f"pip could not install {', '.join(requirements)}:\n{tail}\n"
            "fix: install them yourself (pip install ...) and retry without --deps")
