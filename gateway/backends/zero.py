"""The `zero` backend: in-process zero-work token engine, for measuring gateway overhead."""

from __future__ import annotations

from typing import Any

from envhub.gateway.backends.base import GenerateRequest, GenerateResult
from envhub.gateway.engine.zero import ZeroEngine


class ZeroBackend:
    """Instant fixed completions (" ok" x (length-1) + <|im_end|>), consistent fake logprobs."""

    name = "zero"

    def __init__(self, length: int = 8, *, weight_version: int = 0, instance: str = "zero"):
        self.engine = ZeroEngine(length, weight_version=weight_version)
        self.instance = instance

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await self.engine.generate(request)
        result.instance = self.instance
        return result

    async def load_weights(self, path: str, version: int | None = None) -> int:
        return await self.engine.load_weights(path, version)

    async def health(self) -> dict[str, Any]:
        return {"backend": self.name, "instance": self.instance, "status": "ok",
                **self.engine.stats()}

    async def aclose(self) -> None:
        pass
