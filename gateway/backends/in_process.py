"""What the in-process backends share: an engine object in this process, stamped results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from envhub.gateway.backends.base import GenerateRequest, GenerateResult, WeightsNotLoadable

if TYPE_CHECKING:
    from envhub.gateway.engine.server import ServedEngine


class InProcessBackend:
    """Adapts an engine with `generate`, `load_weights`, `stats` and `weight_version` to the
    Backend protocol; subclasses build the engine and say how to close it."""

    name = "in-process"
    remote: ClassVar[bool] = False
    text_only: ClassVar[bool] = False
    engine: ServedEngine  # Engine or ZeroEngine (gateway/engine)
    instance: str

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    @weight_version.setter
    def weight_version(self, version: int) -> None:
        # Only a fleet's out-of-band update sets versions; nothing can push weights into this
        # process behind the engine's back.
        raise WeightsNotLoadable(f"{self.instance} runs in the gateway's process: load weights "
                                 "with a checkpoint path (POST /admin/weights {\"path\": ...}), "
                                 "not out of band")

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
