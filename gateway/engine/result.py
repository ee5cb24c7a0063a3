"""The engine's result type: the backend contract's result plus vLLM's `stop_reason`."""

from __future__ import annotations

from dataclasses import dataclass

from envhub.gateway.backends.base import GenerateResult


@dataclass
class EngineResult(GenerateResult):
    stop_reason: int | str | None = None  # the stop id or string that ended it (None: EOS)
