"""Continuous batching on one thread: requests join the running batch at the next step.

Each loop iteration (1) admits waiting requests: prefills them together (left-padded) and
samples their first token, then merges their KV cache into the running batch; (2) runs one
decode step for every running row: one token per row, or, for rows with a draft (grouped
speculative decoding, speculative.py), the draft verified in the same forward. Rows that finish
(or whose caller went away) leave the batch at once. A pending weight update stops admission,
lets running rows finish (drain), swaps the weights, then admission resumes: a sequence is
never produced by two weight versions.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

import torch

from envhub.gateway.backends.base import GenerateRequest
from envhub.gateway.engine import kv
from envhub.gateway.engine.guide import Matcher
from envhub.gateway.engine.result import EngineResult
from envhub.gateway.engine.sampling import Draw, draw
from envhub.gateway.engine.speculative import (
    START_DRAFT,
    DraftIndex,
    accept,
    logits_at,
    next_draft_len,
)
from envhub.gateway.engine.stops import Decoder, StopRule
from envhub.gateway.engine.weights import apply_weights
from envhub.gateway.errors import Conflict


class EngineFailure(RuntimeError):
    """The model raised during a forward pass; the rows in flight are failed with this."""


@dataclass
class Job:
    request: GenerateRequest
    ignore_eos: bool = False
    future: Future = field(default_factory=Future)
    matcher: Matcher | None = None  # structured outputs: the row's grammar state


@dataclass
class WeightSwap:
    tensors: dict[str, torch.Tensor]
    version: int | None
    future: Future = field(default_factory=Future)


@dataclass
class Row:
    job: Job
    rule: StopRule
    generator: torch.Generator
    version: int
    prompt_len: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] | None = None
    forwards: int = 0  # forward passes that produced this row's tokens
    draft_key: int | None = None  # its sequence in the group's DraftIndex, when it drafts
    draft_len: int = START_DRAFT  # adapted to how its drafts fare


@dataclass
class BatchStats:
    decode_steps: int = 0
    prefills: int = 0
    max_batch_size: int = 0  # most rows in one decode step: > 1 proves requests were batched
    batch_sizes: Counter = field(default_factory=Counter)  # rows per decode step -> steps
    finished: int = 0
    generated_tokens: int = 0
    spec_steps: int = 0  # decode steps that verified at least one draft
    drafted_tokens: int = 0
    accepted_tokens: int = 0


class Scheduler:
    def __init__(self, model: Any, device: torch.device, eos_ids: set[int], decoder: Decoder,
                 max_batch_size: int, max_prefill_tokens: int, version: int, seed: int,
                 drafts: DraftIndex | None = None, max_draft: int = 8):
        self.model = model
        self._kv_name = kv.cache_name(model)  # forward's cache argument, the output's field
        self.device = device
        self.eos_ids = eos_ids
        self.decoder = decoder
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.version = version
        self.stats = BatchStats()
        self.drafts = drafts  # None: speculative decoding off
        self.max_draft = max_draft
        self._shared_generator = torch.Generator(device=device).manual_seed(seed)
        self._waiting: deque[Job] = deque()
        self._swap: WeightSwap | None = None
        self._cv = threading.Condition()
        self._closed = False
        self._rows: list[Row] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # [B, T] attention mask of the running batch
        self._thread = threading.Thread(target=self._run, name="envhub-engine", daemon=True)
        self._thread.start()

    # -- called from other threads -------------------------------------------------------
    def submit(self, job: Job) -> Future:
        with self._cv:
            if self._closed:
                raise EngineFailure("engine is closed")
            self._waiting.append(job)
            self._cv.notify()
        return job.future

    def swap(self, swap: WeightSwap) -> Future:
        with self._cv:
            if self._swap is not None:
                raise Conflict("a weight update is already in progress; retry when it is done")
            self._swap = swap
            self._cv.notify()
        return swap.future

    def load(self) -> dict[str, int]:
        with self._cv:
            return {"running": len(self._rows), "waiting": len(self._waiting)}

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=30)

    # -- the engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cv:
                    while not (self._closed or self._waiting or self._rows or self._swap):
                        self._cv.wait()
                    if self._closed:
                        break
                    swap = self._swap if not self._rows else None
                    admitted = [] if self._swap else self._take()
                try:
                    if swap is not None:
                        self._apply(swap)
                        continue
                    if admitted:
                        self._prefill(admitted)
                    if self._rows:
                        self._decode()
                except Exception as exc:  # noqa: BLE001  fail the rows in flight, keep serving
                    self._fail_all(admitted, EngineFailure(f"forward pass failed: {exc!r}"))
        self._fail_all(list(self._waiting), EngineFailure("engine closed"))

    def _take(self) -> list[Job]:
        """Waiting jobs that fit the batch and the prefill budget (always at least one)."""
        jobs: list[Job] = []
        longest = 0
        while self._waiting and len(self._rows) + len(jobs) < self.max_batch_size:
            job = self._waiting[0]
            n = len(job.request.prompt_ids)
            if jobs and max(longest, n) * (len(jobs) + 1) > self.max_prefill_tokens:
                break
            self._waiting.popleft()
            if not job.future.cancelled():  # cancelled: the caller already went away
                jobs.append(job)
                longest = max(longest, n)
        return jobs

    def _apply(self, swap: WeightSwap) -> None:
        try:
            apply_weights(swap.tensors, self.model)
        except Exception as exc:  # noqa: BLE001  handed to the caller of load_weights
            _settle(swap.future, exc)
        else:
            self.version = swap.version if swap.version is not None else self.version + 1
            _settle(swap.future, self.version)
        with self._cv:
            self._swap = None

    def _new_row(self, job: Job) -> Row:
        p = job.request.params
        if p.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(p.seed)
        else:
            generator = self._shared_generator
        rule = StopRule(p.max_tokens, self.eos_ids, p.stop_token_ids, p.stop, self.decoder,
                        ignore_eos=job.ignore_eos)
        return Row(job, rule, generator, self.version, len(job.request.prompt_ids),
                   tops=[] if p.top_logprobs > 0 else None,
                   draft_len=min(START_DRAFT, self.max_draft))

    def _prefill(self, jobs: list[Job]) -> None:
        rows = [self._new_row(job) for job in jobs]
        for r in rows:  # a grouped row's sequence is a draft source for its group (and itself)
            if self.drafts is not None and r.job.request.group_id:
                r.draft_key = self.drafts.open(r.job.request.group_id, r.job.request.prompt_ids)
        try:
            self._prefill_rows(rows)
        except BaseException:  # the jobs fail (_run): their sequences stop being live drafts
            for r in rows:
                self._forget(r)  # closing twice is harmless
            raise

    def _prefill_rows(self, rows: list[Row]) -> None:
        length = max(r.prompt_len for r in rows)
        ids = torch.zeros(len(rows), length, dtype=torch.long)  # [B, L], left-padded
        mask = torch.zeros(len(rows), length, dtype=torch.long)
        for i, r in enumerate(rows):
            n = r.prompt_len
            ids[i, length - n:] = torch.tensor(r.job.request.prompt_ids, dtype=torch.long)
            mask[i, length - n:] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1, **{self._kv_name: kv.DynamicCache()})
        self.stats.prefills += 1
        keep = self._sample(rows, out.logits[:, -1, :].float())
        if not keep:
            return
        cache, mask = kv.select(getattr(out, self._kv_name), mask, keep)
        new_rows = [rows[i] for i in keep]
        if self._rows:
            assert self._mask is not None
            self._cache, self._mask = kv.merge(self._cache, self._mask, cache, mask)
            self._rows += new_rows
        else:
            self._cache, self._mask, self._rows = cache, mask, new_rows

    def _decode(self) -> None:
        rows = self._rows
        assert self._mask is not None
        self.stats.decode_steps += 1
        self.stats.batch_sizes[len(rows)] += 1
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(rows))
        drafts = [self._draft(r) for r in rows] if self.drafts is not None else []
        if any(drafts):
            self._verify(rows, drafts)
            return
        ids = torch.tensor([[r.ids[-1]] for r in rows], device=self.device)  # [B, 1]
        # The token fed now is the last sampled one: position = tokens before it.
        positions = torch.tensor([[r.prompt_len + len(r.ids) - 1] for r in rows],
                                 device=self.device)
        mask = torch.cat([self._mask, self._mask.new_ones(len(rows), 1)], dim=1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1, **{self._kv_name: self._cache})
        cache = getattr(out, self._kv_name)
        keep = self._sample(rows, out.logits[:, -1, :].float())
        self._keep(rows, keep, cache, mask)

    def _keep(self, rows: list[Row], keep: list[int], cache: Any, mask: torch.Tensor) -> None:
        """The running batch after a step: rows `keep` of `rows` with their cache and mask."""
        if len(keep) == len(rows):
            self._cache, self._mask = cache, mask
        elif keep:
            self._cache, self._mask = kv.select(cache, mask, keep)
            self._rows = [rows[i] for i in keep]
        else:
            self._cache, self._mask, self._rows = None, None, []

    def _draft(self, row: Row) -> list[int]:
        """The row's draft this step ([] for none): rows under a grammar do not speculate."""
        if self.drafts is None or row.draft_key is None or row.job.matcher is not None:
            return []
        k = min(row.draft_len, row.rule.max_tokens - len(row.ids) - 1)  # room for one more
        return self.drafts.propose(row.job.request.group_id, row.draft_key, k) if k > 0 else []

    def _verify(self, rows: list[Row], drafts: list[list[int]]) -> None:
        """One forward over [last, d_1 .. d_k] per row (k = 0 without a draft), padded to the
        longest draft with dummy slots masked out; each row emits its accepted drafts plus one
        token (speculative.accept). Rejected and dummy slots stay in the cache with mask 0, so
        no later query sees them (positions are explicit, so the holes are harmless), and
        columns no row uses are dropped."""
        assert self._mask is not None
        width = 1 + max(len(d) for d in drafts)
        ids = torch.zeros(len(rows), width, dtype=torch.long)  # [B, 1 + K]
        block = torch.zeros(len(rows), width, dtype=torch.long)  # 1: a real slot
        for i, (r, d) in enumerate(zip(rows, drafts, strict=True)):
            ids[i, :1 + len(d)] = torch.tensor([r.ids[-1], *d], dtype=torch.long)
            block[i, :1 + len(d)] = 1
        start = torch.tensor([[r.prompt_len + len(r.ids) - 1] for r in rows])  # [B, 1]
        # a row's dummy slots repeat its last real position: never past the row's own end
        # (learned position tables, long-context RoPE scaling that switches on max position)
        real = torch.tensor([[len(d)] for d in drafts])  # [B, 1]
        positions = (start + torch.arange(width).clamp(max=real)).to(self.device)  # [B, 1 + K]
        past = self._mask.shape[1]
        mask = torch.cat([self._mask, block.to(self.device)], dim=1)  # [B, T + 1 + K]
        slots = block.flatten().nonzero().flatten().to(self.device)  # [N] real slots of B x W
        with logits_at(self.model, slots) as gathered:  # the LM head skips dummy slots
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask,
                             position_ids=positions, use_cache=True, logits_to_keep=width,
                             **{self._kv_name: self._cache})
        # [N, V] (row i's 1 + k_i slots in order) or, without the hook, [B * W, V]
        logits = out.logits.float().flatten(0, 1)
        expect = len(slots) if gathered else len(rows) * width
        if logits.shape[0] != expect:  # the head was not where the logits came from
            raise RuntimeError(f"verify step: {logits.shape[0]} logit rows, expected {expect}")
        at = [0]
        for d in drafts:
            at.append(at[-1] + (1 + len(d) if gathered else width))
        self.stats.spec_steps += 1
        keep = []
        for i, (row, d) in enumerate(zip(rows, drafts, strict=True)):
            if row.job.future.cancelled():
                self._forget(row)
                continue
            p = row.job.request.params
            emitted = accept(logits[at[i]:at[i] + 1 + len(d)], d, p.temperature, p.top_p,
                             p.top_logprobs, row.generator) if d \
                else [self._draw(row, logits[at[i]])]  # a grammar's rows take this path
            accepted = len(emitted) - 1
            mask[i, past + 1 + accepted:] = 0  # rejected drafts and dummies
            row.forwards += 1
            before = len(row.ids)
            if self._emit(row, emitted):
                keep.append(i)
            if d:
                self.stats.drafted_tokens += len(d)
                # drafts that reached the output (a stop inside the draft drops the rest)
                self.stats.accepted_tokens += min(accepted, len(row.ids) - before)
                row.draft_len = next_draft_len(row.draft_len, len(d), accepted, self.max_draft)
        kept = set(keep)
        done = [i for i in range(len(rows)) if i not in kept]
        mask[done, past:] = 0  # finished rows keep no column alive
        cache, mask = kv.drop_dead(getattr(out, self._kv_name), mask, past)
        self._keep(rows, keep, cache, mask)
        if self._mask is not None and self._mask.shape[1] > 2 * int(self._mask.sum(1).max()) + 64:
            # one row's accepted drafts are holes in every other row: close them before the
            # cache (memory, attention cost) outgrows the longest row by more than 2x
            self._cache, self._mask = kv.compact(self._cache, self._mask)

    def _sample(self, rows: list[Row], logits: torch.Tensor) -> list[int]:
        """Draw one token per row; finish rows that are done; return the indices still running."""
        keep = []
        for i, row in enumerate(rows):
            if row.job.future.cancelled():
                self._forget(row)
                continue
            row.forwards += 1
            if self._emit(row, [self._draw(row, logits[i])]):
                keep.append(i)
        return keep

    def _draw(self, row: Row, logits_V: torch.Tensor) -> Draw:
        """One token for `row` from its next-token logits [V], under its grammar if any."""
        p = row.job.request.params
        matcher = row.job.matcher
        d = draw(logits_V if matcher is None else matcher.restrict(logits_V), p.temperature,
                 p.top_p, p.top_logprobs, row.generator)
        if matcher is not None:
            matcher.advance(d.token)
        return d

    def _emit(self, row: Row, draws: list[Draw]) -> bool:
        """Append sampled tokens in order, checking the stop rule after each (the rest of a
        verified draft is dropped at a stop); False when the row finished."""
        finish = None
        before = len(row.ids)
        for d in draws:
            row.ids.append(d.token)
            row.logprobs.append(d.logprob)
            if row.tops is not None and d.top is not None:
                row.tops.append(d.top)
            self.stats.generated_tokens += 1
            finish = row.rule.check(row.ids)
            if finish is not None:
                break
        if self.drafts is not None and row.draft_key is not None:
            self.drafts.extend(row.job.request.group_id, row.draft_key, row.ids[before:])
        if finish is None:
            return True
        self._forget(row)
        self.stats.finished += 1
        _settle(row.job.future, EngineResult(
            completion_ids=row.ids, logprobs=row.logprobs, finish_reason=finish.reason,
            weight_version=row.version, top_logprobs=row.tops,
            prompt_ids_seen=list(row.job.request.prompt_ids), stop_reason=finish.stop_reason,
            forwards=row.forwards))
        return False

    def _forget(self, row: Row) -> None:
        """The row left the batch: its sequence stays a draft source, no longer extended."""
        if self.drafts is not None and row.draft_key is not None:
            self.drafts.close(row.job.request.group_id, row.draft_key)

    def _fail_all(self, admitted: list[Job], exc: Exception) -> None:
        for row in self._rows:
            self._forget(row)
        for job in [r.job for r in self._rows] + admitted:
            _settle(job.future, exc)
        self._rows, self._cache, self._mask = [], None, None


def _settle(future: Future, outcome: Any) -> None:
    """Resolve a future the caller may cancel at any moment (futures stay PENDING until
    resolved, so a caller that goes away cancels them and its row is dropped)."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass  # cancelled in between: nobody is waiting for it
