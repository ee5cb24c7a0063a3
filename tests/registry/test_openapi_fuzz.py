"""Schemathesis against the registry's own OpenAPI spec, on a real server process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.registry.conftest import Server, make_env, run_cli
from tests.support import require

# Bounded (12 examples per operation, one worker), but ~400 requests: minutes on a busy box.
pytestmark = pytest.mark.slow

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance,response_headers_conformance,unsupported_method")


def test_no_5xx_and_responses_match_the_spec(server: Server, tmp_path: Path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    require(st is not None, "schemathesis (`pip install schemathesis`)")
    # A real package, so the spec's examples (alice/my-env@1.2.0) reach the found paths too.
    env = make_env(tmp_path / "env")
    home = {**os.environ, "ENVHUB_HOME": str(tmp_path / "home")}
    out = run_cli("publish", str(env), "--no-audit", "--registry", server.url, "--token",
                  server.tokens["alice"], env=home)
    assert out.returncode == 0, out.stderr
    proc = subprocess.run(
        [str(st), "run", f"{server.url}/openapi.json", "--checks", CHECKS,
         "--max-examples", "12", "--seed", "7", "--workers", "1",
         "--generation-database", "none", "--no-color", "--request-timeout", "30",
         "-H", f"Authorization: Bearer {server.tokens['alice']}"],
        capture_output=True, text=True, timeout=500, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout
