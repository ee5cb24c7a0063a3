"""Content-addressed blob store: `<root>/sha256/<2 hex>/<64 hex>`, written atomically."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from envhub.registry.errors import BadRequest

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def check_digest(digest: str) -> str:
    if not DIGEST_RE.match(digest):
        raise BadRequest(f"'{digest[:80]}' is not a digest; use 'sha256:' + 64 lowercase hex "
                         "digits")
    return digest


class BlobStore:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        hexd = check_digest(digest).split(":", 1)[1]
        return self.root / "sha256" / hexd[:2] / hexd

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def incoming(self) -> Path:
        """A fresh temp file on the store's filesystem; the caller deletes it when done."""
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
        os.close(fd)
        return Path(tmp)

    def place(self, tmp: Path, digest: str) -> bool:
        """Move `tmp` into place under `digest`; returns False if the blob already existed."""
        target = self.path(digest)
        if target.is_file():
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, target)
        return True

    def remove(self, digest: str) -> None:
        target = self.path(digest)
        target.unlink(missing_ok=True)
        for parent in (target.parent, target.parent.parent):
            try:
                parent.rmdir()  # only if empty
            except OSError:
                break
