"""Backends: where token ids are sampled. `make_backend` builds one from the gateway config."""

from __future__ import annotations

from envhub.gateway.backends.base import Backend, GenerateRequest, GenerateResult, SamplingParams
from envhub.gateway.config import GatewayConfig

__all__ = ["Backend", "GenerateRequest", "GenerateResult", "SamplingParams", "make_backend"]


def make_backend(config: GatewayConfig) -> Backend:
    kind = config.backend
    if kind == "local":
        from envhub.gateway.backends.local import LocalBackend

        return LocalBackend.from_config(config)
    if kind == "zero":
        from envhub.gateway.backends.zero import ZeroBackend

        return ZeroBackend()
    if kind in ("vllm", "sglang", "openai"):
        from envhub.gateway.router import make_fleet

        return make_fleet(config)
    raise ValueError(f"unknown backend {kind!r}; use local, vllm, sglang, zero or openai")
