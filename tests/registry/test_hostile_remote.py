"""A hostile or broken registry server: install checks what it answers before trusting it.

The server here is a few lines of http.server returning canned answers (the real registry
would never send them), so every check on the client side gets exercised. It signs its answers
with a key of its own, as a compromised registry holding its key would: what install checks
beyond the signature must still stop them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from envhub.registry.catalog import version_record
from envhub.registry.errors import BadPackage, DigestMismatch, RegistryError, TooLarge
from envhub.registry.install import install
from envhub.registry.signing import RegistryKey
from envhub.registry.sources import RemoteRegistry
from tests.registry.conftest import tree

BLOB = b"\x1f\x8b" + b"not really a package" * 10
GOOD = {"owner": "alice", "name": "my-env", "version": "1.2.0",
        "digest": "sha256:" + hashlib.sha256(BLOB).hexdigest(), "size": len(BLOB)}


KEY = RegistryKey(Ed25519PrivateKey.generate())


def signed(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer with its version record signed (as the real registry's resolve sends it)."""
    text, signature = KEY.sign(version_record(str(answer["owner"]), str(answer["name"]),
                                              str(answer["version"]), str(answer["digest"])))
    return {**answer, "signed": {"record": text, "signature": signature, "key_id": KEY.key_id}}


class Canned:
    resolve: dict[str, Any] = GOOD
    resolve_status = 200
    blob: bytes = BLOB


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if "/resolve" in self.path:
            answer = signed(Canned.resolve) if Canned.resolve_status == 200 and {
                "owner", "name", "version", "digest"} <= set(Canned.resolve) else Canned.resolve
            self._send(Canned.resolve_status, json.dumps(answer).encode())
        elif self.path.endswith("/key"):
            self._send(200, json.dumps({"algorithm": "ed25519", "key": KEY.public_b64,
                                        "key_id": KEY.key_id}).encode())
        elif "/blobs/" in self.path:
            self._send(200, Canned.blob, "application/gzip")
        else:
            self._send(404, b'{"error": {"code": "not_found", "message": "nope"}}')


@pytest.fixture
def evil(home: Path) -> Iterator[RemoteRegistry]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Canned.resolve, Canned.resolve_status, Canned.blob = GOOD, 200, BLOB
    reg = RemoteRegistry(f"http://127.0.0.1:{httpd.server_address[1]}")
    yield reg
    asyncio.run(reg.aclose())
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(("answer", "error", "match"), [
    ({"owner": "../../.."}, BadPackage, "answered ../../../my-env@1.2.0"),
    ({"name": "other"}, BadPackage, "answered alice/other@1.2.0"),
    ({"version": "9.9.9"}, BadPackage, "answered alice/my-env@9.9.9"),
    ({"version": "../../x"}, BadPackage, "bad version record"),
    ({"digest": "sha256:../../etc"}, BadPackage, "bad version record"),
    ({"size": 10**12}, TooLarge, "over the"),
    ({"size": 10}, DigestMismatch, "larger than"),
    ({"digest": "sha256:" + "0" * 64}, DigestMismatch, "tampered"),
])
def test_hostile_answers_are_refused(evil: RemoteRegistry, home: Path, answer: dict[str, Any],
                                     error: type[RegistryError], match: str) -> None:
    Canned.resolve = {**GOOD, **answer}
    before = tree(home)
    with pytest.raises(error, match=match):
        asyncio.run(install("alice/my-env@1.2.0", evil, home))
    assert tree(home) == before
    assert not (home.parent / "my-env").exists()


def test_broken_server_answers_are_clean_errors(evil: RemoteRegistry, home: Path) -> None:
    Canned.resolve_status = 500
    Canned.resolve = {"unexpected": "shape"}
    with pytest.raises(RegistryError, match="HTTP 500"):
        asyncio.run(install("alice/my-env@1.2.0", evil, home))
    Canned.resolve_status = 200
    Canned.resolve = {"owner": "alice"}  # not a version record at all
    with pytest.raises(RegistryError, match="not a valid answer"):
        asyncio.run(install("alice/my-env@1.2.0", evil, home))
    assert tree(home) == set()
