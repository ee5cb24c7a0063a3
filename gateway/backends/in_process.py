"""What the in-process backends share: an engine object in this process, stamped results."""

from __future__ import annotations

from typing import Any

from envhub.gateway.backends.base import GenerateRequest, GenerateResult


class InProcessBackend:
    """Adapts an engine with `generate`, `load_weights`, `stats` and `weight_version` to the
    Backend protocol; subclasses build the engine and say how to close it."""

    name = "in-process"
    engine: Any
    instance: str

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await self.engine.generate(request)
        result.instance = self.instance
        return result

    async def load_weights(self, path: str, version: int | None = None) -> int:
        """Swap weights between batches; returns the new weight version."""
        return await self.engine.load_weights(path, version)

    async def health(self) -> dict[str, Any]:
        return {"backend": self.name, "instance": self.instance, "status": "ok",
                **self.engine.stats()}

    async def aclose(self) -> None:
        pass
