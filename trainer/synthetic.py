"""Group rollouts sampled from a real causal LM, for tests and benchmarks (product code).

No gateway or environment is involved, but every sampled token and its logprob come from
the model (temperature 1, the full softmax), so the rollout logprobs are real. A session
alternates model completions with "tool output" deltas; every `cm_every` turns a
context-management break starts a new segment from a shortened prefix (the prompt's first
`keep_prompt` tokens + a fresh "summary"), recorded as a `summarize` CMAction — the shape
the gateway records. Shapes of the arrays follow sdk/types.py.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envhub.sdk.types import (
    RUNNER,
    CMAction,
    RewardEvent,
    Segment,
    SessionInfo,
    SessionStatus,
    Trajectory,
    Turn,
)

if TYPE_CHECKING:
    import torch


@dataclass
class RolloutShape:
    """How a synthetic group looks."""

    sessions: int = 8
    turns: int = 4
    prompt_len: int = 24
    completion_len: tuple[int, int] = (3, 8)  # inclusive range of sampled tokens per turn
    tool_len: tuple[int, int] = (2, 6)  # inclusive range of tool-output tokens per turn
    cm_every: int = 0  # a context-management break every N turns (0: never)
    keep_prompt: int = 12  # prompt tokens kept by a break
    summary_len: int = 4
    weight_version: int = 0


def _sample(model: Any, history: list[int], n: int, gen: torch.Generator
            ) -> tuple[list[int], list[float]]:
    """Sample n tokens after `history` at temperature 1; return ids and their logprobs."""
    import torch

    ids: list[int] = []
    lps: list[float] = []
    with torch.no_grad():
        # newer transformers call the KV cache `cache` (`past_key_values` warns there)
        name = "cache" if "cache" in inspect.signature(model.forward).parameters \
            else "past_key_values"
        out = model(input_ids=torch.tensor([history]), use_cache=True)
        for _ in range(n):
            logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(tok)
            lps.append(float(logp[tok]))
            out = model(input_ids=torch.tensor([[tok]]), use_cache=True,
                        **{name: getattr(out, name)})
    return ids, lps


def sample_session(model: Any, prompt: list[int], shape: RolloutShape, session: SessionInfo,
                   gen: torch.Generator, vocab: int) -> Trajectory:
    """One session: turns of (delta, sampled completion), CM breaks as new segments."""
    import torch

    def rand(lo_hi: tuple[int, int] | int) -> list[int]:
        n = lo_hi if isinstance(lo_hi, int) else int(torch.randint(lo_hi[0], lo_hi[1] + 1, (1,),
                                                                   generator=gen))
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    turns: list[Turn] = []
    segments: list[Segment] = []
    actions: list[CMAction] = []
    seg = Segment(index=0, token_ids=[], loss_mask=[], logprobs=[], weight_versions=[])
    delta = list(prompt)
    for seq in range(shape.turns):
        if shape.cm_every and seq and seq % shape.cm_every == 0:
            segments.append(seg)
            before = len(seg.token_ids)
            seg = Segment(index=seg.index + 1, token_ids=[], loss_mask=[], logprobs=[],
                          weight_versions=[])
            delta = prompt[: shape.keep_prompt] + rand(shape.summary_len)
            actions.append(CMAction(kind="summarize", seq=seq, segment=seg.index,
                                    from_seq=seq - 1, tokens_before=before,
                                    tokens_after=len(delta)))
        n = int(torch.randint(shape.completion_len[0], shape.completion_len[1] + 1, (1,),
                              generator=gen))
        ids, lps = _sample(model, seg.token_ids + delta, n, gen)
        v = shape.weight_version
        seg.token_ids += delta + ids
        seg.loss_mask += [0] * len(delta) + [1] * len(ids)
        seg.logprobs += [0.0] * len(delta) + lps
        seg.weight_versions += [-1] * len(delta) + [v] * len(ids)
        seg.turn_seqs.append(seq)
        turns.append(Turn(seq=seq, segment=seg.index, prompt_delta_ids=delta, completion_ids=ids,
                          completion_logprobs=lps, weight_version=v, finish_reason="stop"))
        delta = rand(shape.tool_len)
    segments.append(seg)
    sampled = [t for turn in turns for t in turn.completion_ids]
    # A real, if arbitrary, outcome: the share of even token ids the policy produced.
    outcome = sum(1 for t in sampled if t % 2 == 0) / max(len(sampled), 1)
    session = session.model_copy(update={"status": SessionStatus.done})
    return Trajectory(session=session, segments=segments, turns=turns, cm_actions=actions,
                      rewards=[RewardEvent(kind="outcome", value=outcome, writer=RUNNER)],
                      status=SessionStatus.done)


def sample_group(model: Any, group_id: str, shape: RolloutShape | None = None, *,
                 seed: int = 0, created_at: float = 0.0) -> list[Trajectory]:
    """`shape.sessions` sessions sharing one random prompt, sampled from `model`."""
    import torch

    shape = shape or RolloutShape()
    gen = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    prompt = torch.randint(0, vocab, (shape.prompt_len,), generator=gen).tolist()
    out = []
    for i in range(shape.sessions):
        info = SessionInfo(id=f"{group_id}-s{i}", group_id=group_id, task_id=group_id,
                           sample_index=i, created_at=created_at + i * 1e-3)
        out.append(sample_session(model, prompt, shape, info, gen, vocab))
    return out
