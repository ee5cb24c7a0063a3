"""The swappable inference part of the gateway: token ids in, token ids + logprobs out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)  # stop strings (checked on decoded text)
    stop_token_ids: list[int] = field(default_factory=list)  # besides the model's EOS
    seed: int | None = None
    top_logprobs: int = 0  # >0: also return that many alternatives per sampled token


@dataclass
class GenerateRequest:
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    session_id: str = ""  # routing key: a session sticks to one instance
    # the conversation, for text-only backends (hosted models); token engines ignore them
    messages: list[dict] | None = None
    tools: list[dict] | None = None


@dataclass
class GenerateResult:
    completion_ids: list[int]
    logprobs: list[float]  # logprob of each sampled token under the sampling distribution
    finish_reason: str  # "stop" | "length"
    weight_version: int
    instance: str = ""
    # per sampled token: [(token_id, logprob), ...] when top_logprobs > 0
    top_logprobs: list[list[tuple[int, float]]] | None = None
    prompt_ids_seen: list[int] | None = None  # what the engine reports it received, if it does
    text: str | None = None  # text-only backends (hosted models) fill this instead of ids
    trainable: bool = True

    def __post_init__(self) -> None:
        assert len(self.completion_ids) == len(self.logprobs), (
            f"{len(self.completion_ids)} completion ids vs {len(self.logprobs)} logprobs"
        )


@runtime_checkable
class Backend(Protocol):
    """An inference engine (or a fleet of them) that samples from token ids."""

    name: str

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    async def health(self) -> dict: ...

    async def aclose(self) -> None: ...
