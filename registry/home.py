"""The user's envhub home (`ENVHUB_HOME`, default `~/.envhub`) and saved registry logins.

Layout: `registry/` (the local registry: index.db + blobs), `envs/<owner>/<name>/<version>/`
(installed environments), `credentials.json` (0600: tokens per registry URL and the default
registry chosen by `envhub login`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from envhub.registry.errors import BadRequest

LOCAL = "local"


def envhub_home() -> Path:
    return Path(os.environ.get("ENVHUB_HOME") or "~/.envhub").expanduser()


class Credentials(BaseModel):
    default: str | None = Field(default=None, description="registry URL used when none is given")
    tokens: dict[str, str] = Field(default_factory=dict, description="registry URL -> token")


def credentials_path(home: Path | None = None) -> Path:
    return (home or envhub_home()) / "credentials.json"


def load_credentials(home: Path | None = None) -> Credentials:
    path = credentials_path(home)
    if not path.is_file():
        return Credentials()
    try:
        return Credentials.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, ValidationError):
        raise BadRequest(f"{path} is corrupt; delete it and run `envhub login` again") from None


def save_credentials(creds: Credentials, home: Path | None = None) -> Path:
    """Write atomically with mode 0600 (it holds tokens)."""
    path = credentials_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(creds.model_dump_json(indent=2))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def normalize_url(url: str) -> str:
    return url.rstrip("/")


def choose_registry(registry: str | None, home: Path | None = None) -> str:
    """`--registry` > `ENVHUB_REGISTRY` > the default saved by `envhub login` > local."""
    chosen = registry or os.environ.get("ENVHUB_REGISTRY") or load_credentials(home).default
    return normalize_url(chosen) if chosen and chosen != LOCAL else LOCAL


def choose_token(url: str, token: str | None, home: Path | None = None) -> str | None:
    """`--token` > `ENVHUB_TOKEN` > the token saved by `envhub login URL`."""
    return token or os.environ.get("ENVHUB_TOKEN") or load_credentials(home).tokens.get(
        normalize_url(url))
