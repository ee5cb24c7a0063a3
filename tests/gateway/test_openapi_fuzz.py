"""Schemathesis over the gateway's whole `/openapi.json`, on a real gateway on loopback (the
scripted engine, an admin key): no 5xx, and every answer matches the spec (status code,
content type, body schema, headers, `Allow` on 405)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from envhub.gateway.backends.scripted import ScriptedBackend
from envhub.gateway.server import GatewayHandle
from tests.gateway.conftest import start
from tests.support import require

# Bounded (20 examples per operation, one worker), but ~1000 requests: minutes on a busy box.
pytestmark = pytest.mark.slow

ADMIN = "fuzz-admin-key"
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance,response_headers_conformance,unsupported_method,"
          "allow_header_conformance")


@pytest.fixture
def locked(tmp_path: Path, tool_script: ScriptedBackend) -> Iterator[GatewayHandle]:
    handle = start(tmp_path, tool_script, admin_key=ADMIN)
    yield handle
    handle.close()


def _schemathesis(url: str, key: str, cwd: Path, *only: str) -> subprocess.CompletedProcess:
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    require(st is not None, "schemathesis (`pip install schemathesis`)")
    return subprocess.run(
        [str(st), "run", f"{url}/openapi.json", "--checks", CHECKS, "--max-examples", "20",
         "--seed", "7", "--workers", "1", "--generation-database", "none", "--no-color",
         "--request-timeout", "30", "-H", f"Authorization: Bearer {key}", *only],
        capture_output=True, text=True, timeout=560, cwd=cwd, check=False)


def test_the_spec_describes_every_request_body(locked: GatewayHandle) -> None:
    """Every POST route publishes its body (a fuzzer or client generator has something to
    go on), and the body models' components resolve."""
    spec = httpx.get(f"{locked.url}/openapi.json").json()
    schemas = spec["components"]["schemas"]
    bare = {"/admin/resume", "/v1/responses/{response_id}/cancel"}  # take no body
    for path, ops in spec["paths"].items():
        if "post" in ops and path not in bare:
            ref = ops["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.rsplit("/", 1)[1] in schemas, path
    chat = schemas["ChatRequest"]
    assert {"model", "messages"} <= set(chat["required"])
    assert chat["properties"]["stream"]["anyOf"][0] == {"type": "boolean"}
    assert schemas["MessagesRequest"]["properties"]["max_tokens"]["maximum"] == 1 << 20
    # the Responses API's flat function tool and the chat route's nested one stay apart
    assert "name" in schemas["FunctionTool"]["properties"]
    assert "function" in schemas["ChatFunctionTool"]["properties"]
    assert all("422" not in op["responses"] for ops in spec["paths"].values()
               for op in ops.values())  # invalid input is a 400 in the API's own shape


def test_admin_key_no_5xx_and_answers_match_the_spec(locked: GatewayHandle,
                                                     tmp_path: Path) -> None:
    """Every operation with the admin key: the session and admin routes in full, the model
    routes up to authentication (validation comes first)."""
    proc = _schemathesis(locked.url, ADMIN, tmp_path)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout


def test_session_key_no_5xx_and_answers_match_the_spec(locked: GatewayHandle,
                                                       tmp_path: Path) -> None:
    """The model routes with a session's own key: requests that pass validation reach the
    engine and are recorded."""
    made = httpx.post(f"{locked.url}/sessions", json={"session_id": "fuzz"},
                      headers={"authorization": f"Bearer {ADMIN}"})
    assert made.status_code == 201, made.text
    proc = _schemathesis(locked.url, made.json()["api_key"], tmp_path,
                         "--include-path-regex", "^/v1/")
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout
