"""Backends: where token ids are sampled. The contract is in base.py; this table names them.

`GatewayConfig.backend` (and an upstream's `kind`) is a key of `BACKENDS` or the dotted path of
a class, e.g. `--backend my_pkg.engines.MyBackend`. Adding a backend: its own file here plus
one line below.
"""

from __future__ import annotations

from typing import cast

from envhub.gateway.backends.base import (
    Backend,
    BackendClass,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightsNotLoadable,
)
from envhub.gateway.config import GatewayConfig
from envhub.sdk.plugins import load_class

__all__ = ["BACKENDS", "Backend", "BackendClass", "GenerateRequest", "GenerateResult",
           "SamplingParams", "WeightsNotLoadable", "backend_class", "check_backend",
           "make_backend"]

BACKENDS: dict[str, str] = {
    "local": "envhub.gateway.backends.local.LocalBackend",  # embedded engine (the default)
    "zero": "envhub.gateway.backends.zero.ZeroBackend",  # zero-work engine (overhead)
    "scripted": "envhub.gateway.backends.scripted.ScriptedBackend",  # replays --script texts
    "vllm": "envhub.gateway.backends.vllm.VLLMBackend",
    "sglang": "envhub.gateway.backends.sglang.SGLangBackend",
    "openai": "envhub.gateway.backends.litellm.LiteLLMBackend",  # hosted models, text only
}


def backend_class(name: str) -> BackendClass:
    """The class a backend name or dotted path stands for (ValueError listing the choices)."""
    cls = load_class(name, BACKENDS, "backend")
    missing = [a for a in ("remote", "text_only", "from_config") if not hasattr(cls, a)]
    if missing:
        raise ValueError(f"backend {name!r} ({cls.__qualname__}) lacks {', '.join(missing)}: "
                         "see BackendClass in envhub/gateway/backends/base.py")
    return cast(BackendClass, cls)


def make_backend(config: GatewayConfig) -> Backend:
    """The backend the config names: one in-process engine, or a fleet over its upstreams."""
    cls = backend_class(config.backend)
    if not cls.remote:
        return cls.from_config(config, None)
    from envhub.gateway.router import make_fleet

    return make_fleet(config)


def check_backend(config: GatewayConfig) -> None:
    """Fail fast (the CLI, before loading anything): the backend name resolves and a remote
    backend has upstreams. Raises ValueError or a GatewayError with the fix."""
    if backend_class(config.backend).remote:
        from envhub.gateway.router import fleet_specs

        fleet_specs(config)
