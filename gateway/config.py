"""Gateway configuration. CLI flags of `envhub gateway` map 1:1 onto these fields."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from envhub.gateway.model_names import ModelNames
from envhub.sdk.device import DEVICES, DTYPES, check_device, check_dtype

BUNDLED_MODEL = Path(__file__).parent / "engine" / "tiny"


class GatewayConfig(BaseModel):
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8400, ge=0, le=65535, description="port; 0 picks a free one")
    model: str | None = Field(None, description="HF model folder for the local engine and the "
                                                "tokenizer; default: the bundled tiny model")
    model_name: str | None = Field(None, description="name served on /v1/models (default: "
                                                     "the model folder's name)")
    model_aliases: list[str] = Field(
        default_factory=list,
        description="PATTERN=MODEL (repeatable): a requested model name matching the fnmatch "
                    "glob PATTERN (e.g. 'claude-*') is served by MODEL (the served name or "
                    "'default'); first match wins. None given: every name is served by the "
                    "served model. Given: other names get 404")
    tokenizer: str | None = Field(None, description="tokenizer folder when it differs from model")
    chat_template: str | None = Field(None, description="jinja file or built-in name "
                                                        "('deepseek_v3') overriding the model's")
    backend: str = Field("local", description="engine backend: a name in "
                                              "envhub.gateway.backends.BACKENDS (local, zero, "
                                              "scripted, vllm, sglang, openai) or the dotted "
                                              "path of a backend class")
    script: str | None = Field(None, description="scripted backend: JSON file holding a list of "
                                                 "completion texts, answered once each in order")
    upstreams: list[str] = Field(default_factory=list,
                                 description="engine URLs for vllm/sglang backends")
    db: str = Field("sqlite:///envhub-pool.db", description="pool URL: sqlite:///FILE or "
                                                           "postgresql://...")
    admin_key: str | None = Field(None, min_length=1,
                                  description="when set, sessions must be created with it, "
                                              "unknown keys get 401 and a session key reaches "
                                              "only its own session; required to listen on a "
                                              "non-loopback address")
    public_url: str | None = Field(
        None, pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="URL agents reach this gateway at, returned by POST /sessions; behind a "
                    "proxy (deploy/nginx) the proxy's, e.g. http://gateways.internal:8400. "
                    "Default: this process's own address")
    max_body_bytes: int = Field(64 << 20, ge=1024, description="request body limit")
    default_max_tokens: int = Field(256, ge=1, description="completion budget when a request "
                                                          "sets none")
    max_model_len: int = Field(32768, ge=16, description="prompt + completion token limit")
    device: str | None = Field(None, description=f"local engine: where the model runs, {DEVICES} "
                               "(default auto: cuda when present, else cpu)")
    dtype: str = Field("auto", description=f"local engine: the weights' and the compute's dtype, "
                       f"{', '.join(DTYPES)} (auto: bfloat16 on cuda, float32 elsewhere)")
    engine_max_batch: int = Field(32, ge=1, description="local engine: rows per decode batch")
    engine_speculative: Literal["off", "group"] = Field(
        "off", description="local engine: 'group' drafts tokens from the other samples of a "
        "session's group and verifies them exactly (Seer's grouped speculative decoding)")
    # Fleet (vllm / sglang / openai upstreams): gateway/router.py.
    fleet_config: str | None = Field(None, description="TOML or YAML file listing upstreams "
                                                       "([[upstream]] kind, url, name, model)")
    heartbeat_interval: float = Field(1.0, gt=0, le=3600, description="seconds between health "
                                                                     "probes of each instance")
    heartbeat_timeout: float = Field(2.0, gt=0, le=600, description="a probe slower than this "
                                                                   "counts as a missed beat")
    heartbeat_misses: int = Field(2, ge=1, description="missed beats (or failed calls in a row) "
                                                       "that take an instance out of rotation")
    fleet_retries: int = Field(2, ge=0, le=10, description="extra attempts of a failed call, "
                                                          "each on another instance")
    pause_wait: float = Field(60.0, ge=0, description="seconds a call waits while the fleet is "
                                                      "paused before it gets 429 + Retry-After")
    upstream_timeout: float = Field(600.0, gt=0, description="seconds one engine call may take")
    sticky_load_factor: float = Field(1.5, ge=1.0, description="a session leaves its instance "
                                                               "when that one carries more than "
                                                               "this x the mean load")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str | None) -> str | None:
        return None if v is None else check_device(v)

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        return check_dtype(v)

    @model_validator(mode="after")
    def _exposed_needs_admin_key(self) -> GatewayConfig:
        # Without an admin key every caller is trusted (local single-user mode: any token opens
        # a session, anyone lists sessions and reads trajectories); only loopback may have that.
        if self.admin_key is None and not is_loopback(self.host):
            raise ValueError(f"listening on {self.host!r} without an admin key would let anyone "
                             "who can reach it read every session; set --admin-key or "
                             "ENVHUB_ADMIN_KEY, or listen on 127.0.0.1")
        self.model_table()  # a bad alias fails here, before anything starts
        return self

    def model_table(self) -> ModelNames:
        return ModelNames([self.served_name(), "default"], self.model_aliases)

    def model_path(self) -> Path:
        return Path(self.model) if self.model else BUNDLED_MODEL

    def tokenizer_path(self) -> Path:
        return Path(self.tokenizer) if self.tokenizer else self.model_path()

    def served_name(self) -> str:
        return self.model_name or self.model_path().name


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; anything else (0.0.0.0, "", a name) may be reachable."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
