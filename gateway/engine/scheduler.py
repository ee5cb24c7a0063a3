"""Continuous batching on one thread: requests join the running batch at the next step.

Each loop iteration (1) admits waiting requests: prefills them together (left-padded) and
samples their first token, then merges their KV cache into the running batch; (2) runs one
decode step for every running row. Rows that finish (or whose caller went away) leave the
batch at once. A pending weight update stops admission, lets running rows finish (drain), swaps
the weights, then admission resumes: a sequence is never produced by two weight versions.
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
from envhub.gateway.engine.sampling import draw
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


@dataclass
class BatchStats:
    decode_steps: int = 0
    prefills: int = 0
    max_batch_size: int = 0  # most rows in one decode step: > 1 proves requests were batched
    batch_sizes: Counter = field(default_factory=Counter)  # rows per decode step -> steps
    finished: int = 0
    generated_tokens: int = 0


class Scheduler:
    def __init__(self, model: Any, device: torch.device, eos_ids: set[int], decoder: Decoder,
                 max_batch_size: int, max_prefill_tokens: int, version: int, seed: int):
        self.model = model
        self._kv_name = kv.cache_name(model)  # forward's cache argument, the output's field
        self.device = device
        self.eos_ids = eos_ids
        self.decoder = decoder
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.version = version
        self.stats = BatchStats()
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
                   tops=[] if p.top_logprobs > 0 else None)

    def _prefill(self, jobs: list[Job]) -> None:
        rows = [self._new_row(job) for job in jobs]
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
        ids = torch.tensor([[r.ids[-1]] for r in rows], device=self.device)  # [B, 1]
        # The token fed now is the last sampled one: position = tokens before it.
        positions = torch.tensor([[r.prompt_len + len(r.ids) - 1] for r in rows],
                                 device=self.device)
        mask = torch.cat([self._mask, self._mask.new_ones(len(rows), 1)], dim=1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1, **{self._kv_name: self._cache})
        cache = getattr(out, self._kv_name)
        keep = self._sample(rows, out.logits[:, -1, :].float())
        if len(keep) == len(rows):
            self._cache, self._mask = cache, mask
        elif keep:
            self._cache, self._mask = kv.select(cache, mask, keep)
            self._rows = [rows[i] for i in keep]
        else:
            self._cache, self._mask, self._rows = None, None, []

    def _sample(self, rows: list[Row], logits: torch.Tensor) -> list[int]:
        """Draw one token per row; finish rows that are done; return the indices still running."""
        keep = []
        for i, row in enumerate(rows):
            if row.job.future.cancelled():
                continue
            p = row.job.request.params
            matcher = row.job.matcher
            row_logits = logits[i] if matcher is None else matcher.restrict(logits[i])
            d = draw(row_logits, p.temperature, p.top_p, p.top_logprobs, row.generator)
            if matcher is not None:
                matcher.advance(d.token)
            row.ids.append(d.token)
            row.logprobs.append(d.logprob)
            if row.tops is not None and d.top is not None:
                row.tops.append(d.top)
            self.stats.generated_tokens += 1
            finish = row.rule.check(row.ids)
            if finish is None:
                keep.append(i)
                continue
            self.stats.finished += 1
            _settle(row.job.future, EngineResult(
                completion_ids=row.ids, logprobs=row.logprobs, finish_reason=finish.reason,
                weight_version=row.version, top_logprobs=row.tops,
                prompt_ids_seen=list(row.job.request.prompt_ids), stop_reason=finish.stop_reason))
        return keep

    def _fail_all(self, admitted: list[Job], exc: Exception) -> None:
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
