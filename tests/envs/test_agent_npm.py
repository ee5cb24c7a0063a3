"""`--agent-install npm:...`: specs checked before anything runs, a real package from the npm
registry installed into the cache with node beside it, its `bin` entries runnable with nothing
but the bundle (no node on PATH), and npm's own reason when a package cannot be had."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from envhub.envs.agents.install import AgentInstall, build_bundle
from envhub.envs.agents.npm import check_spec
from envhub.envs.errors import AgentSpecError
from tests.support import require


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    require(shutil.which("npm") is not None, "node and npm (apt-get install nodejs npm)")
    monkeypatch.setenv("ENVHUB_AGENT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("spec,name", [("@openai/codex@0.169.0", "@openai/codex"),
                                       ("semver", "semver"), ("semver@^7.6", "semver"),
                                       ("@anthropic-ai/claude-code", "@anthropic-ai/claude-code")])
def test_npm_specs_name_their_package(spec: str, name: str) -> None:
    assert check_spec(spec) == name
    assert AgentInstall.parse(f"npm:{spec}").value == spec


@pytest.mark.parametrize("bad", ["npm:", "npm:../x", "npm:Upper", "npm:a b", "npm:@scope",
                                 "npm:/etc/passwd", "npm:x@"])
def test_bad_npm_specs_say_what_a_spec_looks_like(bad: str) -> None:
    with pytest.raises(AgentSpecError, match="npm:"):
        AgentInstall.parse(bad)


def test_an_npm_package_runs_from_its_bundle_with_the_bundled_node(cache: Path) -> None:
    bundle = build_bundle([AgentInstall.parse("npm:semver@7.6.3")], "3.11")
    program = bundle / "bin" / "semver"
    assert (bundle / "bin" / "node").is_file()
    # no node on PATH: the wrapper runs the package with the bundle's own node
    ran = subprocess.run([str(program), "1.2.3", "-r", ">=1.0"], env={"PATH": "/nonexistent"},
                         capture_output=True, text=True, check=False)
    assert (ran.returncode, ran.stdout.strip()) == (0, "1.2.3"), ran.stderr
    assert build_bundle([AgentInstall.parse("npm:semver@7.6.3")], "3.11") == bundle  # cached


def test_a_package_npm_cannot_install_fails_with_npms_reason_and_leaves_nothing(
        cache: Path) -> None:
    with pytest.raises(AgentSpecError, match="E404|404"):
        build_bundle([AgentInstall.parse("npm:envhub-no-such-package-3f9c1a")], "3.11")
    assert not [p for p in cache.iterdir() if not p.name.startswith("pip-")]
