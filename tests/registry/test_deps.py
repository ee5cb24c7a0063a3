"""Declared Python dependencies: skipped when satisfied, pip-installed when missing only on
request (--deps: a real pip run, offline, from a wheel built here), never from a direct URL."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envhub.cli import app
from envhub.registry.deps import unsatisfied
from envhub.registry.install import installed
from tests.registry.conftest import make_env

DEP = "envhub-regtest-dep"
MODULE = "envhub_regtest_dep"
runner = CliRunner()


def build_wheel(folder: Path, version: str = "0.1.0") -> Path:
    """A minimal pure-Python wheel, so pip can install offline (--no-index --find-links)."""
    dist = f"{MODULE}-{version}.dist-info"
    files = {
        f"{MODULE}/__init__.py": b"VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {DEP}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: envhub-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{MODULE}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


@pytest.fixture
def offline_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    wheels = tmp_path / "wheels"
    build_wheel(wheels)
    # pip reads these from the environment: no index, only our folder.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    yield wheels
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", DEP],
                   capture_output=True, check=False)


def test_unsatisfied() -> None:
    assert unsatisfied(["packaging>=20", "pydantic>=2"]) == []
    assert unsatisfied(["packaging<1"]) == ["packaging<1"]
    assert unsatisfied([f"{DEP}>=0.1"]) == [f"{DEP}>=0.1"]
    assert unsatisfied([f"{DEP}>=0.1; python_version < '3'"]) == []  # marker excludes it


def test_missing_dependency_is_pip_installed(home: Path, tmp_path: Path,
                                             offline_wheel: Path) -> None:
    env = make_env(tmp_path / "env", extra=f'dependencies = ["packaging>=20", "{DEP}==0.1.0"]')
    published = runner.invoke(app, ["publish", str(env), "--no-audit", "--owner", "alice"])
    assert published.exit_code == 0

    for flags in ([], ["--no-deps"]):  # nothing is pip-installed unasked
        result = runner.invoke(app, ["install", "alice/my-env@1.2.0", "--force", *flags])
        assert result.exit_code == 0, result.output
        assert f"not installed: {DEP}==0.1.0" in result.output and "--deps" in result.output
        assert installed()[0].missing_dependencies == [f"{DEP}==0.1.0"]
        assert unsatisfied([f"{DEP}==0.1.0"]) == [f"{DEP}==0.1.0"]

    result = runner.invoke(app, ["install", "alice/my-env@1.2.0", "--force", "--deps"])
    assert result.exit_code == 0, result.output
    assert "warning: not installed" not in result.output
    assert unsatisfied([f"{DEP}==0.1.0", "packaging>=20"]) == []
    assert installed()[0].missing_dependencies == []
    probe = subprocess.run([sys.executable, "-c", f"import {MODULE}; print({MODULE}.VALUE)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "42"


def test_pip_failure_is_a_clear_error_and_installs_nothing(home: Path, tmp_path: Path,
                                                           offline_wheel: Path) -> None:
    env = make_env(tmp_path / "env", extra=f'dependencies = ["{DEP}==9.9.9"]')
    published = runner.invoke(app, ["publish", str(env), "--no-audit", "--owner", "alice"])
    assert published.exit_code == 0
    result = runner.invoke(app, ["install", "alice/my-env@1.2.0", "--deps"])
    assert result.exit_code == 2
    assert "pip could not install" in result.output and "without --deps" in result.output
    assert installed() == []
    assert not (home / "envs").exists() or not any((home / "envs").rglob("*"))


@pytest.mark.parametrize("dep", [
    f"{DEP} @ http://127.0.0.1:9/{MODULE}-0.1.0-py3-none-any.whl",
    f"{DEP} @ https://example.invalid/{MODULE}.whl",
    f"{DEP} @ git+https://example.invalid/x.git@main",
    f"{DEP} @ file:///tmp/{MODULE}.whl",
])
def test_a_direct_url_dependency_is_refused_at_publish(home: Path, tmp_path: Path,
                                                       dep: str) -> None:
    """A requirement naming an address installs whatever that address serves, into envhub's
    interpreter, where a .pth runs in every later grader and trainer: refused with the fix."""
    env = make_env(tmp_path / "env", extra=f'dependencies = ["{dep}"]')
    result = runner.invoke(app, ["publish", str(env), "--no-audit", "--owner", "alice"])
    assert result.exit_code == 2, result.output
    assert "direct URL or VCS reference" in result.output and "version range" in result.output
    assert runner.invoke(app, ["install", "alice/my-env@1.2.0"]).exit_code == 2  # not there
