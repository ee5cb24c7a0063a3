"""The embedded inference engine, the zero-work engine and the bundled tiny model.

`Engine` needs torch (the `[engine]` extra) and is imported lazily, so importing this package
(for `ZeroEngine`, `EngineConfig` or `BUNDLED_MODEL`) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envhub.gateway.engine.config import BUNDLED_MODEL, EngineConfig
from envhub.gateway.engine.result import EngineResult
from envhub.gateway.engine.zero import ZeroEngine

if TYPE_CHECKING:
    from envhub.gateway.engine.engine import Engine

__all__ = ["BUNDLED_MODEL", "Engine", "EngineConfig", "EngineResult", "ZeroEngine"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from envhub.gateway.engine.engine import Engine

        return Engine
    raise AttributeError(name)
