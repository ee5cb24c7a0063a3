"""The local backend: the in-process engine behind the Backend protocol."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from envhub.gateway.backends.base import Backend, GenerateRequest, SamplingParams
from envhub.gateway.config import GatewayConfig

pytest.importorskip("torch")

from envhub.gateway.backends.local import LocalBackend
from envhub.gateway.engine import BUNDLED_MODEL


def test_local_backend_from_gateway_config(tmp_path: Path) -> None:
    backend = LocalBackend.from_config(GatewayConfig(engine_max_batch=4, max_model_len=64,
                                                     device="cpu"))
    assert isinstance(backend, Backend)

    async def scenario():
        greedy = GenerateRequest([151644, 872, 198], SamplingParams(max_tokens=5, temperature=0))
        results = await asyncio.gather(*(backend.generate(greedy) for _ in range(3)))
        version = await backend.load_weights(str(BUNDLED_MODEL))
        health = await backend.health()
        too_long = GenerateRequest([1] * 60, SamplingParams(max_tokens=5))
        return results, version, health, too_long

    try:
        results, version, health, too_long = asyncio.run(scenario())
        assert all(r.completion_ids == results[0].completion_ids for r in results)
        assert all(r.instance == "local" and r.weight_version == 0 for r in results)
        assert version == 1 == backend.weight_version == health["weight_version"]
        assert health["status"] == "ok" and health["max_batch_size"] >= 1
        from envhub.gateway.errors import BadRequest

        with pytest.raises(BadRequest, match="maximum context length is 64"):
            asyncio.run(backend.generate(too_long))
    finally:
        asyncio.run(backend.aclose())
