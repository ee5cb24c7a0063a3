"""The embedded engine on the bundled tiny model: logprob contract, sampling, stops, batching,
cancellation and weight swaps. Real model, real tokenizer, real scheduler thread."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import save_file

from envhub.gateway.backends.base import GenerateRequest, SamplingParams
from envhub.gateway.engine import BUNDLED_MODEL, Engine, EngineConfig
from envhub.gateway.errors import BadRequest

PROMPT = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def req(prompt: list[int] = PROMPT, **params: Any) -> GenerateRequest:
    return GenerateRequest(prompt_ids=list(prompt), params=SamplingParams(**params))


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    e = Engine(EngineConfig(threads=1, max_batch_size=8))
    yield e
    e.close()


def full_forward_logprobs(engine: Engine, prompt: list[int], completion: list[int],
                          temperature: float) -> list[float]:
    """log_softmax(logits / T) of each completion token, from one unbatched forward pass."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0].float()  # [L, V]
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / scale, dim=-1)
    start = len(prompt) - 1  # logits at position i predict token i + 1
    return [float(logp[start + i, t]) for i, t in enumerate(completion)]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_are_the_sampling_distribution(engine: Engine, temperature: float) -> None:
    r = run(engine.generate(req(max_tokens=24, temperature=temperature, seed=3)))
    # The bundled model may close its answer (<|im_end|>) before 24 tokens.
    n = len(r.completion_ids)
    assert n == len(r.logprobs) and n >= 8, r
    assert r.finish_reason == "stop" if n < 24 else r.finish_reason in ("stop", "length"), r
    expected = full_forward_logprobs(engine, PROMPT, r.completion_ids, temperature)
    assert max(abs(a - b) for a, b in zip(r.logprobs, expected, strict=True)) < 1e-3
    assert all(lp <= 0 for lp in r.logprobs)
    assert r.prompt_ids_seen == PROMPT and r.weight_version == engine.weight_version


def test_greedy_picks_the_argmax(engine: Engine) -> None:
    r = run(engine.generate(req(max_tokens=12, temperature=0, top_logprobs=3)))
    assert r.top_logprobs is not None and len(r.top_logprobs) == 12
    for token, lp, top in zip(r.completion_ids, r.logprobs, r.top_logprobs, strict=True):
        assert top[0][0] == token and abs(top[0][1] - lp) < 1e-6
        assert [x[1] for x in top] == sorted((x[1] for x in top), reverse=True)


def test_top_p_truncates_sampling_but_not_the_reported_logprob(engine: Engine) -> None:
    """A nucleus of one token forces the argmax, yet the logprob is the full distribution's."""
    greedy = run(engine.generate(req(max_tokens=10, temperature=0)))
    r = run(engine.generate(req(max_tokens=10, temperature=1.0, top_p=1e-6, seed=1)))
    assert r.completion_ids == greedy.completion_ids
    expected = full_forward_logprobs(engine, PROMPT, r.completion_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(r.logprobs, expected, strict=True)) < 1e-3
    assert min(r.logprobs) < -1e-3  # not the 0.0 a truncated distribution would report


def test_seed_determinism(engine: Engine) -> None:
    async def both() -> list[Any]:
        # Run the seeded request among unrelated ones: the batch must not change its draws.
        noise = [engine.generate(req(PROMPT[:5 + i], max_tokens=20, temperature=1.0))
                 for i in range(3)]
        return await asyncio.gather(engine.generate(req(max_tokens=32, temperature=1.0,
                                                        seed=42)), *noise)

    alone = run(engine.generate(req(max_tokens=32, temperature=1.0, seed=42)))
    batched = run(both())[0]
    other = run(engine.generate(req(max_tokens=32, temperature=1.0, seed=43)))
    assert batched.completion_ids == alone.completion_ids
    assert max(abs(a - b) for a, b in zip(batched.logprobs, alone.logprobs, strict=True)) < 1e-3
    assert other.completion_ids != alone.completion_ids


def first_new_index(ids: list[int], start: int) -> int:
    return next(k for k in range(start, len(ids)) if ids[k] not in ids[:k])


def test_stop_token_ids(engine: Engine) -> None:
    greedy = run(engine.generate(req(max_tokens=20, temperature=0))).completion_ids
    k = first_new_index(greedy, 4)
    r = run(engine.generate(req(max_tokens=20, temperature=0, stop_token_ids=[greedy[k]])))
    assert r.completion_ids == greedy[:k + 1]  # the stop id is kept: it was sampled
    assert (r.finish_reason, r.stop_reason) == ("stop", greedy[k])


def test_stop_string_keeps_the_completing_token(engine: Engine) -> None:
    greedy = run(engine.generate(req(max_tokens=20, temperature=0))).completion_ids
    decode = engine.tokenizer.decode
    for k in range(5, 20):
        stop = decode(greedy[:k + 1])[-2:]  # spans the end of token k (and maybe k - 1)
        if stop.strip() and "\ufffd" not in stop and stop not in decode(greedy[:k]):
            break
    else:
        pytest.fail("no usable stop string in the greedy completion")
    r = run(engine.generate(req(max_tokens=20, temperature=0, stop=["never-there", stop])))
    assert r.completion_ids == greedy[:k + 1]
    assert (r.finish_reason, r.stop_reason) == ("stop", stop)


def test_eos_from_generation_config(tmp_path: Path) -> None:
    """EOS ids come from generation_config.json; the EOS token is kept, stop_reason is None."""
    for f in BUNDLED_MODEL.iterdir():
        if f.name != "generation_config.json":
            (tmp_path / f.name).symlink_to(f)
    probe = Engine(EngineConfig(model=str(BUNDLED_MODEL), threads=1))
    greedy = run(probe.generate(req(max_tokens=12, temperature=0))).completion_ids
    probe.close()
    k = first_new_index(greedy, 3)
    (tmp_path / "generation_config.json").write_text(f'{{"eos_token_id": [{greedy[k]}]}}')
    e = Engine(EngineConfig(model=str(tmp_path), threads=1))
    try:
        r = run(e.generate(req(max_tokens=12, temperature=0)))
        assert r.completion_ids == greedy[:k + 1]
        assert (r.finish_reason, r.stop_reason) == ("stop", None)
        ignored = run(e.generate(req(max_tokens=12, temperature=0), ignore_eos=True))
        assert ignored.completion_ids == greedy and ignored.finish_reason == "length"
    finally:
        e.close()


def test_concurrent_requests_are_batched_and_unchanged(engine: Engine) -> None:
    prompts = [PROMPT[:4 + 2 * i] for i in range(6)]
    alone = [run(engine.generate(req(p, max_tokens=16, temperature=0))) for p in prompts]
    before = engine.stats()["max_batch_size"]

    async def together() -> list[Any]:
        return await asyncio.gather(*(engine.generate(req(p, max_tokens=16, temperature=0))
                                      for p in prompts))

    batched = run(together())
    stats = engine.stats()
    assert stats["max_batch_size"] > 1, stats
    assert before <= stats["max_batch_size"]
    for a, b in zip(alone, batched, strict=True):
        assert a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3


def test_bad_requests_raise_and_engine_keeps_serving(engine: Engine) -> None:
    for bad, param in [(req([]), "prompt"), (req([engine.vocab_size]), "prompt"),
                       (req([-1]), "prompt"), (req(max_tokens=0), "max_tokens"),
                       (req(max_tokens=engine.max_model_len), "max_tokens"),
                       (req(temperature=-1), "temperature"), (req(top_p=0), "top_p")]:
        with pytest.raises(BadRequest) as info:
            run(engine.generate(bad))
        assert info.value.param == param
    assert run(engine.generate(req(max_tokens=2))).finish_reason == "length"


async def _running(engine: Engine, task: asyncio.Task[Any]) -> None:
    """Until the engine runs `task`'s sequence (which ignores EOS, so the window cannot close
    before a starved poller sees it)."""
    deadline = time.monotonic() + 60
    while engine.stats()["running"] == 0:
        assert not task.done() and time.monotonic() < deadline, task
        await asyncio.sleep(0.01)


def test_cancelled_request_leaves_the_batch(engine: Engine) -> None:
    async def cancel_one() -> None:
        task = asyncio.create_task(engine.generate(req(max_tokens=20000, temperature=1.0),
                                                   ignore_eos=True))
        await _running(engine, task)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(cancel_one())
    deadline = time.monotonic() + 60
    while engine.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["running"] == 0
    assert len(run(engine.generate(req(max_tokens=3))).completion_ids) == 3


def perturbed_weights(engine: Engine, path: Path) -> Path:
    state = {k: v.detach().clone().contiguous() for k, v in engine.model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embedding: safetensors stores it once
    gen = torch.Generator().manual_seed(0)
    for k, v in state.items():
        state[k] = v + 0.5 * torch.randn(v.shape, generator=gen, dtype=v.dtype)
    save_file(state, str(path))
    return path


def test_load_weights_swaps_between_sequences(engine: Engine, tmp_path: Path) -> None:
    base = run(engine.generate(req(max_tokens=12, temperature=0)))
    v0 = engine.weight_version
    new = perturbed_weights(engine, tmp_path / "model.safetensors")

    async def swap_while_running() -> tuple[Any, int, Any]:
        long = asyncio.create_task(engine.generate(req(max_tokens=64, temperature=0),
                                                   ignore_eos=True))
        await _running(engine, long)
        version = await engine.load_weights(str(new))
        after = await engine.generate(req(max_tokens=12, temperature=0))
        return await long, version, after

    long, version, after = run(swap_while_running())
    assert version == v0 + 1 == after.weight_version
    assert long.weight_version == v0  # drained: the running sequence never saw new weights
    assert long.completion_ids[:12] == base.completion_ids
    assert after.completion_ids != base.completion_ids

    assert run(engine.load_weights(str(BUNDLED_MODEL), version=7)) == 7  # an HF folder
    back = run(engine.generate(req(max_tokens=12, temperature=0)))
    assert back.completion_ids == base.completion_ids and back.weight_version == 7


def test_load_weights_rejects_unfit_checkpoints(engine: Engine, tmp_path: Path) -> None:
    version = engine.weight_version
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(tmp_path / "shape.safetensors"))
    save_file({"not.a.weight": torch.zeros(1)}, str(tmp_path / "unknown.safetensors"))
    save_file({"model.norm.weight": torch.ones(64)}, str(tmp_path / "partial.safetensors"))
    (tmp_path / "empty").mkdir()
    for name in ["shape.safetensors", "unknown.safetensors", "partial.safetensors", "empty",
                 "missing.safetensors"]:
        with pytest.raises(BadRequest) as info:
            run(engine.load_weights(str(tmp_path / name)))
        assert info.value.param == "model_path"
    assert engine.weight_version == version


def test_any_hf_folder_loads(tmp_path: Path) -> None:
    """A copied model folder (not the bundled path) serves with its own name."""
    shutil.copytree(BUNDLED_MODEL, tmp_path / "my-model")
    e = Engine(EngineConfig(model=str(tmp_path / "my-model"), threads=1, weight_version=3))
    try:
        r = run(e.generate(req(max_tokens=4, temperature=0)))
        assert e.name == "my-model" and r.weight_version == 3 and len(r.completion_ids) == 4
    finally:
        e.close()
    with pytest.raises(FileNotFoundError, match="--model"):
        Engine(EngineConfig(model=str(tmp_path / "nope")))


def test_sampler_frequencies_and_nucleus() -> None:
    """The sampler draws from softmax(logits / T), restricted to the top-p nucleus."""
    from envhub.gateway.engine.sampling import draw

    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = torch.log(probs.clamp(min=1e-30))
    gen = torch.Generator().manual_seed(0)
    n = 20000

    def freq(top_p: float) -> list[float]:
        counts = [0] * 5
        for _ in range(n):
            counts[draw(logits, 1.0, top_p, 0, gen).token] += 1
        return [c / n for c in counts]

    for got, want in zip(freq(1.0), [0.5, 0.3, 0.15, 0.05, 0.0], strict=True):
        assert abs(got - want) < 0.015
    # Mass above token 2 is 0.8 >= top_p: the nucleus is {0, 1}, renormalised to 5/8, 3/8.
    for got, want in zip(freq(0.8), [0.625, 0.375, 0.0, 0.0, 0.0], strict=True):
        assert abs(got - want) < 0.015
    d = draw(logits, 1.0, 0.8, 2, gen)
    assert abs(d.logprob - float(torch.log(probs[d.token]))) < 1e-5  # full distribution's


def test_second_concurrent_weight_update_conflicts(engine: Engine) -> None:
    from envhub.gateway.errors import Conflict

    async def scenario() -> tuple[list[Any], int]:
        long = asyncio.create_task(engine.generate(req(max_tokens=20000, temperature=1.0),
                                                   ignore_eos=True))
        await _running(engine, long)
        loads = [asyncio.create_task(engine.load_weights(str(BUNDLED_MODEL)))
                 for _ in range(2)]
        done, pending = await asyncio.wait(loads, return_when=asyncio.FIRST_COMPLETED)
        failures = [t.exception() for t in done]
        long.cancel()  # the pending update waits for running rows: let it through
        version = await pending.pop()
        return failures, version

    version_before = engine.weight_version
    failures, version = run(scenario())
    assert len(failures) == 1 and isinstance(failures[0], Conflict)
    assert version == version_before + 1 == engine.weight_version
