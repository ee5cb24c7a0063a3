"""The lock (locks/*.txt): every install of the scripts and CI resolves from it, so a release
upstream cannot change what CI installs; the venv the tests run in is the lock's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from envhub.doctor import installed_versions, locked_versions

ROOT = Path(__file__).resolve().parents[1]


def locked() -> dict[str, str]:
    return locked_versions(ROOT / "locks" / "envhub.txt")


def fake_wheel(folder: Path, name: str, version: str) -> None:
    """A pure-Python wheel of `name` `version` with no dependencies (a stand-in release)."""
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA",
                     f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                                      "true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def resolve(tmp_path: Path, index: Path, refresh: bool) -> str:
    """The transformers version scripts/pip_locked.sh would install from `index` (a dry run)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    report = tmp_path / "report.json"
    env = {**os.environ, "ENVHUB_LOCK_REFRESH": "1" if refresh else ""}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "pip_locked.sh"), "envhub", str(venv),
                          "--dry-run", "--ignore-installed", "--no-index", "--find-links",
                          str(index), "--report", str(report), "transformers"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (install,) = json.loads(report.read_text())["install"]
    return install["metadata"]["version"]


def test_a_newer_release_upstream_does_not_change_what_is_installed(tmp_path: Path) -> None:
    """An index offering the locked transformers and a newer one: the install takes the lock's;
    with the lock left out (how scripts/lock.sh refreshes it) the same index gives the newer."""
    pinned = locked()["transformers"]
    index = tmp_path / "index"
    index.mkdir()
    for version in (pinned, "99.0.0"):
        fake_wheel(index, "transformers", version)
    assert resolve(tmp_path, index, refresh=False) == pinned
    assert resolve(tmp_path, index, refresh=True) == "99.0.0"


def test_the_test_venv_is_the_lock() -> None:
    """Every distribution in the interpreter running the tests at its locked version (this is
    .venv, made by scripts/venv.sh); envhub itself is the checkout."""
    import setuptools  # noqa: F401 - puts its vendored dist-infos on sys.path: not installed

    pins = locked()
    wrong = []
    for name, installed in installed_versions().items():
        if name == "envhub":
            continue
        version = installed.split("+")[0]  # local labels are left out of the lock
        if pins.get(name) != version:
            wrong.append(f"{name} {version} (lock: {pins.get(name, 'absent')})")
    assert not wrong, ("installed, not as locked (bash scripts/venv.sh all,dev reinstalls; "
                       f"bash scripts/lock.sh refreshes the lock): {', '.join(sorted(wrong))}")


def test_every_install_of_the_scripts_goes_through_the_lock() -> None:
    """No `pip install` in scripts/ or CI besides scripts/pip_locked.sh's own."""
    for path in [ROOT / ".ci" / "run", *sorted((ROOT / "scripts").glob("*.sh"))]:
        if path.name == "pip_locked.sh":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            assert not re.search(r"\bpip3?\b.*\binstall\b|\buv\b.*\binstall\b", code), \
                f"{path.relative_to(ROOT)}:{n} installs without the lock: {line.strip()}"
