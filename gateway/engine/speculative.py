"""Grouped speculative decoding (Seer): draft from the group's other samples, verify exactly.

The samples of one RL group answer the same prompt, so they repeat each other: tool-call
boilerplate, the question's numbers, whole lines of reasoning. `DraftIndex` keeps, per group,
every sequence (prompt + completion) of its samples, finished and in flight, and of earlier
turns, and counts which token followed each n-gram: a frequency suffix index, like Seer's
(and Arctic Inference's) suffix trees but hashed. A row's draft extends its own sequence one
token at a time with the group's most frequent continuation of the longest matching n-gram
(max_n down to min_n), while that token holds at least `min_share` of the n-gram's counts:
the group's consensus is drafted, spots where the samples disagree end the draft.

`accept` is exact speculative (rejection) sampling for a deterministic draft (the draft
distribution is a point mass): draft token d is accepted with probability p(d), p being the
row's sampling distribution (temperature, top-p); on rejection the token is drawn from p with
d removed. So each emitted token is distributed as p, whatever was drafted, and its recorded
logprob is sampling.py's contract computed from the logits of its own position: the same
numbers non-speculative decoding reports. Greedy rows accept d iff it is the argmax.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from envhub.gateway.engine.sampling import GREEDY_BELOW, Draw, _inverse_cdf, _nucleus

START_DRAFT = 4  # draft length of a new row, before its acceptance is known
PROMPT_TAIL = 2048  # tokens of a prompt indexed: a group's memory is ~ rows x (tail + output)


@dataclass
class _Group:
    seqs: OrderedDict[int, list[int]] = field(default_factory=OrderedDict)  # oldest first
    live: set[int] = field(default_factory=set)  # sequences still being extended
    # hash(n-gram) -> {next token: times seen}
    index: dict[int, dict[int, int]] = field(default_factory=dict)
    tokens: int = 0


class DraftIndex:
    """Per-group n-gram -> next-token counts with bounded memory: the `max_groups` groups used
    last plus any group with a row in flight, each holding at most `max_tokens` tokens of
    finished sequences (the oldest go first, and their counts with them); a sequence in flight
    holds its prompt's last PROMPT_TAIL tokens and its output, so live memory is bounded by the
    batch. Used by the engine thread; `open(..., live=False)` may come from another
    (Engine.remember), hence the lock."""

    def __init__(self, min_n: int = 2, max_n: int = 5, max_groups: int = 64,
                 max_tokens: int = 16384, min_share: float = 0.5):
        assert 1 <= min_n <= max_n, f"n-gram sizes {min_n}..{max_n}"
        self.min_n, self.max_n, self.min_share = min_n, max_n, min_share
        self.max_groups, self.max_tokens = max_groups, max_tokens
        self._groups: OrderedDict[str, _Group] = OrderedDict()
        self._next_key = 0
        self._lock = threading.Lock()

    def open(self, group: str, ids: list[int], live: bool = True) -> int:
        """Start a sequence of `group` with `ids`; returns its key (for `extend`/`close`).
        `live=False` only seeds the index (a finished sample, a reference solution)."""
        with self._lock:
            g = self._groups.get(group)
            if g is None:
                g = self._groups[group] = _Group()
                # the least recently used groups without a row in flight go first (a group
                # with live rows stays: those rows draft from it until they finish)
                idle = [name for name, x in self._groups.items() if not x.live and x is not g]
                for name in idle[:max(0, len(self._groups) - self.max_groups)]:
                    del self._groups[name]
            self._groups.move_to_end(group)
            key, self._next_key = self._next_key, self._next_key + 1
            g.seqs[key] = []
            if live:
                g.live.add(key)
            # only the prompt's tail: drafts continue the end of a sequence, and indexing a
            # long conversation whole on every turn would stall the engine thread
            self._count(g, key, ids[-PROMPT_TAIL:])
            return key

    def extend(self, group: str, key: int, ids: list[int]) -> None:
        with self._lock:
            g = self._groups.get(group)
            if g is not None and key in g.seqs:
                self._count(g, key, ids)

    def close(self, group: str, key: int) -> None:
        """The sequence is finished: it stays a draft source until evicted."""
        with self._lock:
            g = self._groups.get(group)
            if g is not None:
                g.live.discard(key)

    def propose(self, group: str, key: int, k: int) -> list[int]:
        """Up to `k` tokens continuing sequence `key` the way its group mostly did; [] when
        no n-gram ending it was seen or the group disagrees on what comes next."""
        with self._lock:
            g = self._groups.get(group)
            seq = None if g is None else g.seqs.get(key)
            if g is None or seq is None:
                return []
            context, draft = seq[-self.max_n:], list[int]()
            while len(draft) < k and (token := self._next(g, context)) is not None:
                draft.append(token)
                context = context[1:] + [token] if len(context) == self.max_n \
                    else context + [token]
            return draft

    def groups(self) -> int:
        return len(self._groups)

    def _next(self, g: _Group, context: list[int]) -> int | None:
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            counts = g.index.get(hash(tuple(context[-n:])))
            if counts:  # the longest n-gram seen decides, even when it says "unsure"
                token, seen = max(counts.items(), key=lambda kv: kv[1])
                return token if seen >= self.min_share * sum(counts.values()) else None
        return None

    def _count(self, g: _Group, key: int, ids: list[int]) -> None:
        seq = g.seqs[key]
        for t in ids:
            j = len(seq)  # t follows every n-gram that ends at j - 1
            for n in range(self.min_n, min(self.max_n, j) + 1):
                counts = g.index.setdefault(hash(tuple(seq[j - n:j])), {})
                counts[t] = counts.get(t, 0) + 1
            seq.append(t)
        g.tokens += len(ids)
        for old in [k for k in g.seqs if k not in g.live and k != key]:
            if g.tokens <= self.max_tokens:
                break
            self._forget(g, old)

    def _forget(self, g: _Group, key: int) -> None:
        seq = g.seqs.pop(key)
        g.tokens -= len(seq)
        for j in range(1, len(seq)):
            for n in range(self.min_n, min(self.max_n, j) + 1):
                h = hash(tuple(seq[j - n:j]))
                counts = g.index[h]
                counts[seq[j]] -= 1
                if not counts[seq[j]]:
                    del counts[seq[j]]
                    if not counts:
                        del g.index[h]


@contextmanager
def logits_at(model: Any, slots: torch.Tensor) -> Iterator[bool]:
    """Inside: the model's LM head sees only the hidden states at `slots` (indices into the
    flattened [B, W] input), so its logits come out [1, N, V], not [B, W, V]: a verify step's
    dummy slots cost no vocabulary projection (on a small model, most of a forward's cost).
    Whatever the model does to the logits afterwards (scaling, soft-capping) is per element,
    so it stays exact. Yields False (and changes nothing) for a model without an output
    embedding module."""
    head = model.get_output_embeddings()
    if head is None:
        yield False
        return

    def gather(_: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]  # [B, W, H]
        return (hidden.reshape(-1, hidden.shape[-1]).index_select(0, slots)[None], *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield True
    finally:
        handle.remove()


def next_draft_len(k: int, drafted: int, accepted: int, max_draft: int) -> int:
    """Adapt a row's draft length to how its last draft fared: double after a full
    acceptance, halve when less than half was accepted (never under 1)."""
    if accepted == drafted:
        return min(max_draft, 2 * k)
    if 2 * accepted < drafted:
        return max(1, k // 2)
    return k


def accept(logits_KV: torch.Tensor, draft: list[int], temperature: float, top_p: float,
           top_logprobs: int, generator: torch.Generator) -> list[Draw]:
    """Verify `draft` against the logits of one forward over [last, d_1 .. d_k]:
    `logits_KV` [k + 1, V] float32, row j predicting the token after d_1 .. d_j. Returns the
    emitted tokens: the accepted drafts, then one more (the correction drawn after a rejection,
    or a bonus token after d_k); each token's logprob follows sampling.py's contract."""
    assert logits_KV.shape[0] == len(draft) + 1, (logits_KV.shape, len(draft))
    out: list[Draw] = []
    greedy = temperature < GREEDY_BELOW
    for j in range(len(draft) + 1):
        logp = torch.log_softmax(logits_KV[j] if greedy else logits_KV[j] / temperature, -1)
        d = draft[j] if j < len(draft) else None
        token = int(torch.argmax(logp)) if greedy else _draw(logp, d, top_p, generator)
        top = None
        if top_logprobs > 0:
            values, ids = torch.topk(logp, min(top_logprobs, logp.shape[-1]))
            top = list(zip(ids.tolist(), values.tolist(), strict=True))
        out.append(Draw(token, float(logp[token]), top))
        if token != d:
            break
    return out


def _draw(logp: torch.Tensor, d: int | None, top_p: float, generator: torch.Generator) -> int:
    """One token distributed as the row's sampling distribution p (exp(logp), top-p
    renormalised), keeping the draft d with probability p(d) and otherwise drawing from p
    without d: P(d) = p(d) and P(x != d) = (1 - p(d)) * p(x) / (1 - p(d)) = p(x)."""
    def uniform() -> float:
        return float(torch.rand(1, generator=generator, device=logp.device))

    if top_p >= 1.0:
        if d is not None and uniform() < float(logp[d].exp()):
            return d  # p(d) straight from its logprob: no pass over the vocabulary
        probs = logp.exp()  # [V]
    else:
        probs = _nucleus(logp.exp(), top_p)
        if d is not None and uniform() * float(probs.sum()) < float(probs[d]):
            return d
    if d is not None:
        probs[d] = 0.0
        if not bool(probs.sum() > 0):  # float leftovers: all the mass was on d
            return d
    return _inverse_cdf(probs, generator)
