"""The `zero` backend: in-process zero-work token engine, for measuring gateway overhead."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envhub.gateway.backends.in_process import InProcessBackend
from envhub.gateway.engine.zero import ZeroEngine

if TYPE_CHECKING:
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.fleet.upstreams import UpstreamSpec


class ZeroBackend(InProcessBackend):
    """Instant fixed completions (" ok" x (length-1) + <|im_end|>), consistent fake logprobs."""

    name = "zero"

    def __init__(self, length: int = 8, *, weight_version: int = 0, instance: str = "zero"):
        self.engine = ZeroEngine(length, weight_version=weight_version)
        self.instance = instance

    @classmethod
    def from_config(cls, config: GatewayConfig, upstream: UpstreamSpec | None = None
                    ) -> ZeroBackend:
        return cls()
