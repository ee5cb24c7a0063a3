"""Grouped speculative decoding (speculative.py) on the bundled model: exact, not approximate.

Greedy outputs and logprobs equal plain decoding's; the next-token distribution under a forced
draft passes a chi-square test against the model's probabilities; sampled tokens' logprobs are
the model's own; stops and max_tokens cut a verified draft. Real model, real scheduler thread.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from envhub.gateway.backends.base import GenerateRequest, SamplingParams
from envhub.gateway.engine import BUNDLED_MODEL, Engine, EngineConfig
from envhub.gateway.engine.result import EngineResult
from envhub.gateway.engine.speculative import DraftIndex, next_draft_len

PROMPT = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]
# Critical values of chi-square at p = 0.001 by degrees of freedom (buckets - 1).
CHI2_P001 = {4: 18.467, 5: 20.515}


def arith_prompts(count: int) -> list[list[int]]:
    """First-turn prompts of `count` arith tasks, as the built-in agent renders them."""
    from envhub.envs.agents.tool_calling import SYSTEM_PROMPT
    from envhub.envs.agents.toolbox import Toolbox
    from envhub.envs.loader import load_env
    from envhub.gateway.render.chat_template import ChatRenderer
    from envhub.gateway.render.messages import normalize_message

    env = load_env("arith").env
    renderer = ChatRenderer.from_pretrained(BUNDLED_MODEL)
    out = []
    for task in env.load_tasks()[:count]:
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": task.instruction}]
        tools = Toolbox(env, task, sandbox=None).schemas  # type: ignore[arg-type]
        out.append(renderer.render_prompt(
            [normalize_message(m, i) for i, m in enumerate(messages)], tools).ids)
    return out


@pytest.fixture(scope="module")
def plain() -> Iterator[Engine]:
    e = Engine(EngineConfig(threads=1, max_batch_size=32))
    yield e
    e.close()


@pytest.fixture(scope="module")
def spec() -> Iterator[Engine]:
    e = Engine(EngineConfig(threads=1, max_batch_size=32, speculative="group"))
    yield e
    e.close()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return arith_prompts(4)


def gen(engine: Engine, requests: list[GenerateRequest]) -> list[EngineResult]:
    async def go() -> list[EngineResult]:
        return list(await asyncio.gather(*(engine.generate(r) for r in requests)))
    return asyncio.run(go())


def req(prompt: list[int], group: str = "", **params: Any) -> GenerateRequest:
    return GenerateRequest(list(prompt), SamplingParams(**params), group_id=group)


def staggered_group(engine: Engine, prompts: list[list[int]], group: str,
                    **params: Any) -> list[EngineResult]:
    """A group of 8: one sample of prompts[0] first (so the group has text to draft from),
    then 3 more of it and one of each other prompt, all at once: full acceptances, rejections
    (the other questions' numbers) and rows without a draft share the verify forwards."""
    first = gen(engine, [req(prompts[0], group, **params)])
    return first + gen(engine, [req(p, group, **params) for p in group_prompts(prompts)[1:]])


def group_prompts(prompts: list[list[int]]) -> list[list[int]]:
    return [prompts[0]] * 4 + prompts[1:4] + prompts[1:2]


def test_greedy_outputs_and_logprobs_equal_plain_decoding(plain: Engine, spec: Engine,
                                                          prompts: list[list[int]]) -> None:
    before = spec.stats()
    got = staggered_group(spec, prompts, "greedy", max_tokens=64, temperature=0.0)
    want = staggered_group(plain, prompts, "greedy", max_tokens=64, temperature=0.0)
    after = spec.stats()
    drafted = after["drafted_tokens"] - before["drafted_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    assert accepted > 0 and drafted > accepted, (drafted, accepted)  # both paths ran
    assert plain.stats()["drafted_tokens"] == 0
    for g, w in zip(got, want, strict=True):
        assert g.completion_ids == w.completion_ids
        assert g.finish_reason == w.finish_reason and g.stop_reason == w.stop_reason
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs, strict=True)) < 1e-4
    # accepted drafts: fewer forwards than tokens for the samples that could copy the first
    assert all(r.forwards is not None and r.forwards < len(r.completion_ids) for r in got[1:4])
    assert all(r.forwards == len(r.completion_ids) for r in want)


def test_rows_under_a_grammar_keep_it_in_verify_steps(plain: Engine, spec: Engine,
                                                      prompts: list[list[int]]) -> None:
    """A structured-output row does not speculate, but shares verify forwards with rows that
    do: it still samples under its grammar, exactly as without speculation."""
    from envhub.gateway.structured import Constraint

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    json_row = req(PROMPT, max_tokens=24, temperature=0.0,
                   constraint=Constraint(json_schema=schema))
    want = gen(plain, [json_row])[0]
    full = gen(plain, [req(prompts[0], max_tokens=64, temperature=0.0)])[0].completion_ids
    spec.remember("grammar", prompts[0] + full)
    before = spec.stats()["spec_steps"]
    got = gen(spec, [json_row] + [req(prompts[0], "grammar", max_tokens=64, temperature=0.0)
                                  for _ in range(3)])
    assert spec.stats()["spec_steps"] > before
    assert got[0].completion_ids == want.completion_ids
    assert all(r.completion_ids == full for r in got[1:])


def model_logprobs(engine: Engine, prompt: list[int], completion: list[int],
                   temperature: float) -> list[float]:
    """log_softmax(logits / T) of each completion token, from one unbatched forward pass."""
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    start = len(prompt) - 1  # logits at position i predict token i + 1
    return [float(logp[start + i, t]) for i, t in enumerate(completion)]


def test_sampled_logprobs_are_the_models_own(spec: Engine, prompts: list[list[int]]) -> None:
    before = spec.stats()["accepted_tokens"]
    results = staggered_group(spec, prompts, "sampled", max_tokens=64, temperature=0.8,
                              seed=5)
    assert spec.stats()["accepted_tokens"] > before
    for prompt, r in zip(group_prompts(prompts), results, strict=True):
        expected = model_logprobs(spec, prompt, r.completion_ids, 0.8)
        assert max(abs(a - b) for a, b in zip(r.logprobs, expected, strict=True)) < 1e-4


def test_stops_and_max_tokens_cut_a_verified_draft(plain: Engine, spec: Engine,
                                                   prompts: list[list[int]]) -> None:
    full = gen(plain, [req(prompts[0], max_tokens=64, temperature=0.0)])[0].completion_ids
    text = spec.tokenizer.decode(full[4:9])
    cases: list[dict[str, Any]] = [
        {"max_tokens": 7}, {"max_tokens": 12}, {"stop_token_ids": [full[6]]},
        {"stop": [text[len(text) // 2:]]}]
    for i, extra in enumerate(cases):
        group = f"stops-{i}"
        spec.remember(group, prompts[0] + full)  # the whole answer is drafted at once
        params = {"max_tokens": 64, "temperature": 0.0, **extra}
        before = spec.stats()["accepted_tokens"]
        got = gen(spec, [req(prompts[0], group, **params)])[0]
        want = gen(plain, [req(prompts[0], **params)])[0]
        accepted = spec.stats()["accepted_tokens"] - before
        # counted: the drafts that reached the output (the first token came from the prefill)
        assert 0 < accepted <= len(got.completion_ids) - 1, extra
        assert got.completion_ids == want.completion_ids, extra
        assert (got.finish_reason, got.stop_reason) == (want.finish_reason, want.stop_reason)
        assert len(got.logprobs) == len(got.completion_ids)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sampled_distribution_is_the_models(spec: Engine, top_p: float) -> None:
    """Many draws of one next token whose draft is forced (the group is seeded with it):
    the emitted tokens follow the model's sampling distribution (chi-square; with top-p, the
    nucleus renormalised), and the draft was both accepted and rejected."""
    # Context where the bundled model spreads its mass: the greedy answer up to an
    # argument's opening quote; its next token is near-certain (sampled at prefill, kept when
    # it is the expected one), the one after is the token under test.
    greedy = gen(spec, [req(PROMPT, max_tokens=16, temperature=0.0)])[0].completion_ids
    prompt, first = PROMPT + greedy[:14], greedy[14]
    with torch.no_grad():
        logits = spec.model(input_ids=torch.tensor([prompt + [first]])).logits[0, -1].float()
    probs = torch.softmax(logits, dim=-1)
    top = torch.topk(probs, 5).indices.tolist()
    assert float(probs[top].sum()) > 0.8, "the context must spread its mass over a few tokens"
    draft = top[1]
    draws = 3000 if top_p == 1.0 else 800  # top-p sorts the vocabulary at every draw: slow
    before = spec.stats()
    results = []
    for start in range(0, draws, 32):  # a batch at a time: the index keeps the last 64 groups
        chunk = range(start, min(start + 32, draws))
        for i in chunk:
            spec.remember(f"chi-{top_p}-{i}", prompt + [first, draft])
        results += gen(spec, [req(prompt, f"chi-{top_p}-{i}", max_tokens=3, temperature=1.0,
                                  top_p=top_p, seed=i) for i in chunk])
    after = spec.stats()
    seconds = [r.completion_ids[1] for r in results if r.completion_ids[0] == first]
    assert len(seconds) > 0.99 * draws
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    rejected = after["drafted_tokens"] - before["drafted_tokens"] - accepted
    assert accepted > 100 and rejected > 100, (accepted, rejected)
    counts = Counter(t if t in top else -1 for t in seconds)
    expected = dict(zip(top, probs[top].tolist(), strict=True))
    if top_p < 1.0:  # the nucleus is the top 5 here: renormalised, nothing else drawn
        assert float(probs[top[:4]].sum()) < top_p < float(probs[top].sum())
        assert counts[-1] == 0, counts
        expected = {t: p / sum(expected.values()) for t, p in expected.items()}
    else:
        expected[-1] = 1.0 - sum(expected.values())
    n = len(seconds)
    chi2 = sum((counts[t] - n * p) ** 2 / (n * p) for t, p in expected.items())
    assert chi2 < CHI2_P001[len(expected) - 1], (chi2, counts, expected)


def test_draft_index_drafts_the_groups_consensus() -> None:
    index = DraftIndex(min_n=2, max_n=4, max_groups=2, max_tokens=100, min_share=0.6)
    index.open("g", [1, 2, 3, 4, 5, 6], live=False)
    index.open("g", [9, 9, 2, 3, 7, 8], live=False)  # after [2, 3]: 4 once, 7 once
    row = index.open("g", [0, 1, 2, 3])
    assert index.propose("g", row, 5) == [4, 5, 6]  # [1, 2, 3] decides: it is longer
    assert index.propose("g", row, 2) == [4, 5]
    split = index.open("g", [0, 0, 2, 3])
    assert index.propose("g", split, 3) == []  # only [2, 3] matches, and the group is split
    index.extend("g", row, [4, 5])
    assert index.propose("g", row, 3) == [6]
    assert index.propose("other", row, 3) == []
    index.open("h", [1], live=False)
    index.open("i", [1], live=False)  # three groups: "h" goes, "g" has rows in flight
    assert index.propose("g", row, 3) == [6] and index.groups() == 2
    index.close("g", row)
    index.close("g", split)
    index.open("j", [1], live=False)  # now "g" is idle and the least recent: dropped
    assert index.propose("g", row, 3) == [] and index.groups() == 2


def test_draft_index_memory_is_bounded() -> None:
    index = DraftIndex(min_n=2, max_n=3, max_tokens=8)
    index.open("g", [1, 2, 3, 4], live=False)
    probe = index.open("g", [1, 2])
    assert index.propose("g", probe, 2) == [3, 4]
    index.open("g", [5, 6, 7, 8], live=False)  # 10 tokens > 8: the oldest finished one goes
    assert index.propose("g", probe, 2) == []  # its counts went with it


def test_draft_length_adapts() -> None:
    assert next_draft_len(4, 4, 4, 8) == 8 and next_draft_len(8, 8, 8, 8) == 8
    assert next_draft_len(4, 4, 1, 8) == 2 and next_draft_len(1, 1, 0, 8) == 1
    assert next_draft_len(4, 4, 3, 8) == 4


def test_gateway_sends_the_sessions_group_and_reports_forwards(tmp_path: Any) -> None:
    """Through the gateway: two sessions of one group (POST /sessions group_id); the second
    drafts the first one's answer, so its turn took fewer forwards than tokens; /metrics
    counts forwards and their tokens."""
    import httpx

    from tests.support import gateway_in_thread, trajectory_json

    gw = gateway_in_thread(tmp_path, device="cpu", engine_max_batch=4,
                           engine_speculative="group", admin_key="admin")
    admin = {"authorization": "Bearer admin"}
    body = {"model": "default", "max_tokens": 40, "temperature": 0,
            "messages": [{"role": "user", "content": "What is 37 * 12 - 45?"}]}
    try:
        answers, sessions = [], []
        for _ in range(2):
            made = httpx.post(f"{gw.url}/sessions", json={"group_id": "g1"}, headers=admin)
            assert made.status_code == 201, made.text
            sessions.append(made.json()["session_id"])
            r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=60,
                           headers={"authorization": f"Bearer {made.json()['api_key']}"})
            assert r.status_code == 200, r.text
            answers.append(r.json())
        first, second = answers
        tokens = second["usage"]["completion_tokens"]
        assert first["choices"][0]["message"] == second["choices"][0]["message"]
        assert first["envhub"]["forwards"] == [tokens] and tokens > 4
        assert second["envhub"]["forwards"][0] < tokens  # drafted from the first session
        # and each turn's forwards are in the pool
        recorded = [trajectory_json(gw, sid, "admin")["turns"][0]["forwards"] for sid in sessions]
        assert recorded == [first["envhub"]["forwards"][0], second["envhub"]["forwards"][0]]
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert f"envhub_engine_forward_tokens_total {2.0 * tokens}" in metrics
    finally:
        gw.close()


def test_envhub_engine_server_drafts_for_the_vllm_backend(tmp_path: Any) -> None:
    """`envhub engine --speculative group` behind the vllm backend: once the engine has shown
    it is envhub's, requests carry their group; choices report forwards; GET /metrics counts
    drafted and accepted tokens."""
    import httpx

    from envhub.gateway.backends.vllm import VLLMBackend
    from envhub.gateway.engine.process import EngineProcess

    with EngineProcess(["--threads", "1", "--speculative", "group"],
                       log_path=tmp_path / "engine.log") as proc:
        backend = VLLMBackend(proc.url)
        ask = GenerateRequest(list(PROMPT), SamplingParams(max_tokens=24, temperature=0.0),
                              group_id="g")

        async def go() -> list[Any]:
            try:
                return [await backend.generate(ask) for _ in range(3)]
            finally:
                await backend.aclose()

        assert "group_id" not in backend.request_body(ask)  # a real vLLM would warn
        first, second, third = asyncio.run(go())
        assert "group_id" in backend.request_body(ask)
        assert first.completion_ids == second.completion_ids == third.completion_ids
        assert first.forwards == second.forwards == len(first.completion_ids)  # no group yet
        assert third.forwards is not None and third.forwards < len(third.completion_ids)
        metrics = httpx.get(f"{proc.url}/metrics").text
        accepted = next(line for line in metrics.splitlines()
                        if line.startswith("envhub_engine_accepted_tokens "))
        assert float(accepted.split()[1]) > 0, metrics


def test_holes_in_the_cache_and_their_compaction_change_no_logit(plain: Engine) -> None:
    """What a speculative step leaves behind: masked columns in the middle of a row's cache.
    The next token's logits are the same with those holes, and after `kv.compact` moved every
    row's live columns together (the scheduler does it once holes outgrow the rows)."""
    from envhub.gateway.engine import kv

    model, name = plain.model, kv.cache_name(plain.model)
    rows = [PROMPT, PROMPT[3:]]  # left-padded batch of two
    width = len(PROMPT)
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    **{name: kv.DynamicCache()})
        layers = kv.read_layers(getattr(out, name))
        # five garbage columns (a rejected draft) after column 6 of every row, mask 0
        holes = [(torch.cat([k[:, :, :6], torch.randn_like(k[:, :, :5]), k[:, :, 6:]], 2),
                  torch.cat([v[:, :, :6], torch.randn_like(v[:, :, :5]), v[:, :, 6:]], 2))
                 for k, v in layers]
        holed_mask = torch.cat([mask[:, :6], torch.zeros(2, 5, dtype=torch.long), mask[:, 6:]], 1)
        compact_cache, compact_mask = kv.compact(kv.build_cache(holes), holed_mask)
        assert compact_mask.shape[1] == len(PROMPT) and compact_mask.sum() == mask.sum()
        nxt = torch.tensor([[9707], [9707]])
        npos = torch.tensor([[len(PROMPT)], [len(PROMPT) - 3]])

        def logits(cache: object, m: torch.Tensor) -> torch.Tensor:
            m = torch.cat([m, m.new_ones(2, 1)], 1)
            return model(input_ids=nxt, attention_mask=m, position_ids=npos, use_cache=True,
                         **{name: cache}).logits[:, -1].float()

        want = logits(kv.build_cache(layers), mask)
        torch.testing.assert_close(logits(kv.build_cache(holes), holed_mask), want,
                                   atol=1e-4, rtol=0)
        torch.testing.assert_close(logits(compact_cache, compact_mask), want, atol=1e-4, rtol=0)


def test_a_sliding_window_model_refuses_speculation(tmp_path: Any) -> None:
    """transformers' sliding windows count cache columns; speculative steps leave holes in
    them, so a model with a window is refused (not silently inexact)."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=1000, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                        sliding_window=16)
    MistralForCausalLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="sliding-window"):
        Engine(EngineConfig(model=str(tmp_path), tokenizer=str(BUNDLED_MODEL),
                            speculative="group"))
    Engine(EngineConfig(model=str(tmp_path), tokenizer=str(BUNDLED_MODEL))).close()


def test_groups_with_rows_in_flight_are_not_evicted() -> None:
    index = DraftIndex(max_groups=2)
    live = index.open("a", [1, 2, 3, 1, 2, 3])
    for name in "bcd":  # finished samples of other groups
        index.close(name, index.open(name, [4, 5, 6]))
    assert index.groups() == 2  # the idle ones went, "a" stayed
    assert index.propose("a", live, 2) == [1, 2]


def test_a_failed_prefill_leaves_no_live_draft_sequence(spec: Engine,
                                                        prompts: list[list[int]]) -> None:
    """The model raising in a prefill fails the request (a 5xx upstream) and closes the draft
    sequences the prefill opened, so their group can be evicted."""
    model = spec._scheduler.model
    real = model.forward

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("device lost")

    model.forward = broken  # the third-party model fails; the engine's own code runs as is
    try:
        with pytest.raises(Exception, match="device lost"):
            gen(spec, [req(prompts[0], "failed-prefill", max_tokens=4)])
    finally:
        model.forward = real
    drafts = spec._scheduler.drafts
    assert drafts is not None
    assert not drafts._groups["failed-prefill"].live
