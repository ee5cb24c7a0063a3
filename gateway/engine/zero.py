"""A zero-work token engine: answers at once with a fixed completion (for overhead benchmarks).

The completion is `length - 1` copies of a filler token followed by `<|im_end|>` (Qwen2 ids by
default: " ok ok ... ok<|im_end|>"), cut at `max_tokens` (finish `length`) or at a stop id.
Logprobs are fake but consistent: the same request always gets the same ids and logprobs, all
<= 0, and top logprobs contain the sampled token. Same interface as `Engine`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from envhub.gateway.backends.base import GenerateRequest, refuse_constraint
from envhub.gateway.engine.admission import check_request
from envhub.gateway.engine.result import EngineResult
from envhub.gateway.errors import BadRequest

QWEN_OK, QWEN_IM_END, QWEN_ENDOFTEXT, QWEN_VOCAB = 5394, 151645, 151643, 151665
FILLER_LOGPROB, EOS_LOGPROB = -0.25, -0.05  # what the zero engine "believes" of its tokens


class ZeroEngine:
    """Instant fixed completions with the `Engine` interface; no model, no torch."""

    def __init__(self, length: int = 8, *, filler_id: int = QWEN_OK, eos_id: int = QWEN_IM_END,
                 vocab_size: int = QWEN_VOCAB, max_model_len: int = 32768,
                 weight_version: int = 0, name: str = "zero", tokenizer: Any = None):
        if length < 1:
            raise ValueError("zero engine completion length must be >= 1")
        self.length = length
        self.filler_id, self.eos_id = filler_id, eos_id
        self.eos_ids = {eos_id, QWEN_ENDOFTEXT}
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.name = name
        self.model_path = "zero"
        self.tokenizer = tokenizer  # only the HTTP server uses it (to fill `text`)
        self._version = weight_version
        self._requests = 0
        self._tokens = 0

    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, request: GenerateRequest, *, ignore_eos: bool = False
                       ) -> EngineResult:
        check_request(request, self.vocab_size, self.max_model_len)
        refuse_constraint(request, "zero")
        p = request.params
        ids = [self.filler_id] * (self.length - 1) + [self.filler_id if ignore_eos else self.eos_id]
        ids = ids[:p.max_tokens]
        finish, stop_reason = ("stop" if ids[-1] == self.eos_id else "length"), None
        for i, token in enumerate(ids):
            if token in p.stop_token_ids:
                ids, finish, stop_reason = ids[:i + 1], "stop", token
                break
        logprobs = [EOS_LOGPROB if t == self.eos_id else FILLER_LOGPROB for t in ids]
        tops = None
        if p.top_logprobs > 0:
            # The sampled token first, then made-up runners-up with lower logprobs.
            tops = [[(t, lp)] + [((t + k) % self.vocab_size, lp - 2.0 * k)
                                 for k in range(1, p.top_logprobs)]
                    for t, lp in zip(ids, logprobs, strict=True)]
        self._requests += 1
        self._tokens += len(ids)
        return EngineResult(completion_ids=ids, logprobs=logprobs, finish_reason=finish,
                            weight_version=self._version, top_logprobs=tops,
                            prompt_ids_seen=list(request.prompt_ids), stop_reason=stop_reason)

    async def load_weights(self, path: str, version: int | None = None) -> int:
        """Nothing to load; checks the path exists and bumps (or sets) the version."""
        if not Path(path).exists():
            raise BadRequest(f"{path} does not exist", param="model_path")
        self._version = version if version is not None else self._version + 1
        return self._version

    async def set_weight_version(self, version: int) -> None:
        self._version = version

    def stats(self) -> dict[str, Any]:
        return {"finished": self._requests, "generated_tokens": self._tokens,
                "weight_version": self._version, "running": 0, "waiting": 0,
                "max_batch_size": 1, "at": time.time()}

    def close(self) -> None:
        pass
