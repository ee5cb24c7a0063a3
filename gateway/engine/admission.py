"""What a request must satisfy before an engine accepts it (shared by Engine and ZeroEngine)."""

from __future__ import annotations

from envhub.gateway.backends.base import GenerateRequest
from envhub.gateway.errors import BadRequest


def check_request(request: GenerateRequest, vocab_size: int, max_model_len: int) -> None:
    """Raise BadRequest, naming the parameter and the fix, for a request no model can run."""
    ids, p = request.prompt_ids, request.params
    if not ids:
        raise BadRequest("prompt is empty: send at least one token id", param="prompt")
    bad = next((i for i, t in enumerate(ids)
                if type(t) is not int or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise BadRequest(f"prompt token id {ids[bad]!r} at position {bad} is outside the "
                         f"vocabulary [0, {vocab_size})", param="prompt")
    if p.max_tokens < 1:
        raise BadRequest(f"max_tokens must be >= 1, got {p.max_tokens}", param="max_tokens")
    if len(ids) + p.max_tokens > max_model_len:
        raise BadRequest(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{len(ids)} and max_tokens asks {p.max_tokens} more: shorten one",
            param="max_tokens")
    if p.temperature < 0:
        raise BadRequest(f"temperature must be >= 0, got {p.temperature}", param="temperature")
    if not 0 < p.top_p <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {p.top_p}", param="top_p")
    if p.top_logprobs < 0:
        raise BadRequest(f"logprobs must be >= 0, got {p.top_logprobs}", param="logprobs")
