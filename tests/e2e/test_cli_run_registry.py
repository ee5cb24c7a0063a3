"""`envhub run owner/name@version`: a package published to the local registry runs by reference."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import support
from tests.support import require_tool


def envhub(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    return support.envhub(*args, cwd=cwd,
                          env={"ENVHUB_HOME": str(home), "ENVHUB_REGISTRY": "local"})


@pytest.mark.bwrap
@pytest.mark.slow
def test_published_package_runs_by_reference(tmp_path):
    require_tool("bwrap")
    home = tmp_path / "home"
    assert envhub("init", "my-env", cwd=tmp_path, home=home).returncode == 0
    published = envhub("publish", "./my-env", "--no-audit", "--owner", "me", cwd=tmp_path,
                       home=home)
    assert published.returncode == 0, published.stderr
    ran = envhub("run", "me/my-env@0.1.0", "--agent", "oracle", "--sandbox", "local",
                 "--out", "out", cwd=tmp_path, home=home)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["resolved"] == 2
    listed = envhub("list", "--json", cwd=tmp_path, home=home)
    assert "me/my-env@0.1.0" in {r["name"] for r in json.loads(listed.stdout)}
