"""The `local` backend: the embedded engine in this process (the default; CPU or GPU)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from envhub.gateway.backends.in_process import InProcessBackend
from envhub.gateway.engine.config import EngineConfig

if TYPE_CHECKING:
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.engine.engine import Engine
    from envhub.gateway.fleet.upstreams import UpstreamSpec


class LocalBackend(InProcessBackend):
    """Runs requests on an in-process `Engine`; concurrent calls are batched by the engine."""

    name = "local"
    engine: Engine

    def __init__(self, engine: Engine | None = None, *, config: EngineConfig | None = None,
                 instance: str = "local"):
        if engine is None:
            from envhub.gateway.engine.engine import Engine

            engine = Engine(config or EngineConfig())
        self.engine = engine
        self.instance = instance

    @classmethod
    def from_config(cls, config: GatewayConfig, upstream: UpstreamSpec | None = None
                    ) -> LocalBackend:
        """Build the engine the gateway config describes (model folder, device, dtype,
        limits)."""
        return cls(config=EngineConfig(
            model=str(config.model_path()), tokenizer=config.tokenizer,
            device=config.device or "auto", dtype=config.dtype,
            max_batch_size=config.engine_max_batch,
            max_model_len=config.max_model_len, name=config.served_name(),
            speculative=config.engine_speculative))

    async def aclose(self) -> None:
        await asyncio.to_thread(self.engine.close)
