"""Which engines a fleet has: `--upstream kind=url` flags and an optional TOML/YAML file.

    envhub gateway --backend vllm --upstream http://h1:8000 --upstream sglang=http://h2:30000

    # fleet.toml (--fleet-config fleet.toml)
    [[upstream]]
    kind = "sglang"            # a remote backend: vllm | sglang | openai | pkg.mod.Class
    url = "http://h2:30000"
    name = "h2"                # optional; default: the URL
    model = "Qwen/Qwen3-8B"    # optional; sent as `model` (required for openai)
    api_key_env = "H2_KEY"     # optional; bearer token read from this variable
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from envhub.gateway.backends import BACKENDS
from envhub.gateway.errors import BadRequest
from envhub.sdk.plugins import is_dotted_path


def is_kind(name: str) -> bool:
    """A backend name from the table or a dotted path (whether it serves upstreams is checked
    when the member is built)."""
    return name in BACKENDS or is_dotted_path(name)


class UpstreamSpec(BaseModel):
    """One engine instance (or, for `openai`, one hosted-model endpoint)."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field("vllm", description="backend of the instance: vllm, sglang, openai or "
                                          "the dotted path of a backend class")
    url: str = Field(description="base URL, e.g. http://h1:8000")
    name: str | None = Field(None, description="instance name on /metrics and in the pool")
    model: str | None = Field(None, description="model name sent upstream")
    api_key_env: str | None = Field(None, description="environment variable with its API key")

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if not is_kind(v):
            raise ValueError(f"unknown kind {v!r}: use one of {', '.join(BACKENDS)} or the "
                             "dotted path of a backend class")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parsed = urlparse(v)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"{v!r} is not an http(s) URL; write e.g. http://127.0.0.1:8000")
        return v.rstrip("/")

    def instance_name(self) -> str:
        return self.name or self.url

    def api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ValueError(f"upstream {self.instance_name()}: set the environment variable "
                             f"{self.api_key_env} (its api_key_env)")
        return key


def parse_upstream(text: str, default_kind: str = "vllm") -> UpstreamSpec:
    """`kind=url` or a plain URL (then `default_kind`)."""
    kind, sep, url = text.partition("=")
    if not sep or not is_kind(kind.strip()):
        kind, url = default_kind, text
    try:
        return UpstreamSpec.model_validate({"kind": kind.strip(), "url": url.strip()})
    except ValidationError as e:
        raise BadRequest(f"--upstream {text!r}: {e.errors()[0]['msg']}; use KIND=URL with KIND "
                         f"one of {', '.join(BACKENDS)} or a dotted class path",
                         param="upstreams") from None


def load_fleet_file(path: str | Path) -> list[UpstreamSpec]:
    """Upstreams from a TOML (`[[upstream]]` tables) or YAML (`upstream: [...]`) file."""
    p = Path(path)
    if not p.is_file():
        raise BadRequest(f"fleet config {p} does not exist; pass the path of a TOML or YAML "
                         "file with [[upstream]] entries", param="fleet_config")
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data: Any = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        else:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
    except Exception as exc:  # tomllib/yaml raise their own error types
        raise BadRequest(f"cannot parse fleet config {p}: {exc}", param="fleet_config") from exc
    items = data.get("upstream", data.get("upstreams")) if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise BadRequest(f"fleet config {p} lists no upstreams: add [[upstream]] tables with "
                         "kind and url", param="fleet_config")
    specs = []
    for i, item in enumerate(items):
        try:
            specs.append(UpstreamSpec.model_validate(item))
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(x) for x in err["loc"]) or "entry"
            raise BadRequest(f"fleet config {p}, upstream #{i + 1}, field '{field}': "
                             f"{err['msg']}", param="fleet_config") from None
    return specs


def check_unique(specs: list[UpstreamSpec]) -> None:
    names = [s.instance_name() for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadRequest(f"upstreams listed twice: {dupes}; give each a distinct url or name",
                         param="upstreams")
