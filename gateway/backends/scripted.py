"""A backend that answers with scripted texts, tokenized with the real tokenizer.

Product code for tests and demos (the `DeterministicModel` idea from mini-swe-agent): it lets a
test drive realistic multi-turn tool-calling conversations through the whole gateway without a
model that has learned to call tools. Logprobs are not a model's: each sampled token gets
-1.0. It records every prompt it received, like an engine would, for token-exactness checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from envhub.gateway.backends.base import (
    GenerateRequest,
    GenerateResult,
    WeightsNotLoadable,
    refuse_constraint,
)


class ScriptedBackend:
    name = "scripted"
    instance = "scripted"

    def __init__(self, encode: Callable[[str], list[int]], script: list[str],
                 stop_token_id: int, weight_version: int = 0, cycle: bool = True,
                 record_prompts: bool = True):
        if not script:
            raise ValueError("the script needs at least one completion text")
        self._encode = encode
        self._script = script
        self._stop = stop_token_id
        self._next = 0
        self._cycle = cycle
        self.weight_version = weight_version
        self.record_prompts = record_prompts
        self.received: list[tuple[str, list[int]]] = []  # (request_id, prompt ids)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        await asyncio.sleep(0)
        refuse_constraint(request, "scripted")
        if self._next >= len(self._script) and not self._cycle:
            raise RuntimeError("the script is exhausted")
        text = self._script[self._next % len(self._script)]
        self._next += 1
        if self.record_prompts:
            self.received.append((request.request_id, list(request.prompt_ids)))
        ids = self._encode(text) + [self._stop]
        finish = "stop"
        if len(ids) > request.params.max_tokens:
            ids, finish = ids[: request.params.max_tokens], "length"
        return GenerateResult(completion_ids=ids, logprobs=[-1.0] * len(ids),
                              finish_reason=finish, weight_version=self.weight_version,
                              instance=self.instance)

    async def load_weights(self, path: str, version: int | None = None) -> int:
        raise WeightsNotLoadable("the scripted backend replays texts: it has no weights to load")

    async def health(self) -> dict[str, Any]:
        return {"backend": self.name, "weight_version": self.weight_version}

    async def aclose(self) -> None:
        pass
