"""The in-process zero-work backend: instant, consistent, same contract as the others."""

from __future__ import annotations

import asyncio

import pytest

from envhub.gateway.backends.base import Backend, GenerateRequest, SamplingParams
from envhub.gateway.backends.zero import ZeroBackend
from envhub.gateway.engine import BUNDLED_MODEL
from envhub.gateway.errors import BadRequest


def gen(backend: ZeroBackend, prompt: list[int], **params: object):
    return asyncio.run(backend.generate(GenerateRequest(prompt, SamplingParams(**params))))


def test_fixed_completion_and_consistent_logprobs() -> None:
    b = ZeroBackend(length=4)
    assert isinstance(b, Backend)
    r1, r2 = gen(b, [1, 2, 3], top_logprobs=3), gen(b, [1, 2, 3], top_logprobs=3)
    assert r1.completion_ids == r2.completion_ids == [5394, 5394, 5394, 151645]
    assert r1.logprobs == r2.logprobs and all(lp <= 0 for lp in r1.logprobs)
    assert r1.finish_reason == "stop" and r1.instance == "zero"
    assert r1.top_logprobs is not None
    assert all(row[0][0] == t and len(row) == 3 for row, t in zip(r1.top_logprobs,
                                                                   r1.completion_ids, strict=True))
    assert r1.prompt_ids_seen == [1, 2, 3]


def test_text_is_real_qwen_tokens() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    r = gen(ZeroBackend(length=3), [1])
    assert tok.decode(r.completion_ids) == " ok ok<|im_end|>"


def test_limits_stops_and_versions(tmp_path) -> None:
    b = ZeroBackend(length=8, weight_version=2)
    r = gen(b, [1], max_tokens=3)
    assert len(r.completion_ids) == 3 and r.finish_reason == "length"
    stopped = gen(b, [1], stop_token_ids=[5394])
    assert stopped.completion_ids == [5394] and stopped.finish_reason == "stop"
    with pytest.raises(BadRequest):
        gen(b, [151665])
    with pytest.raises(BadRequest):
        gen(b, [1], max_tokens=0)
    assert asyncio.run(b.load_weights(str(tmp_path))) == 3
    assert asyncio.run(b.load_weights(str(tmp_path), version=10)) == 10
    with pytest.raises(BadRequest):
        asyncio.run(b.load_weights(str(tmp_path / "missing")))
    assert gen(b, [1]).weight_version == 10
    assert asyncio.run(b.health())["weight_version"] == 10
