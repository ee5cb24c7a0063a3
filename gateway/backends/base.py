"""The engine contract: what the gateway needs of anything that samples tokens.

One engine (`local`, `zero`, `vllm`, `sglang`, `openai`: one file each beside this one) or a
fleet of them (gateway/router.py) is a `Backend`. Implementations do not inherit from it; the
check is structural. To add a backend: write its file with a class that has the attributes
and methods of `Backend` plus the class-side `remote`, `text_only` and `from_config` of
`BackendClass`, and add one line to `BACKENDS` in gateway/backends/__init__.py (or name the
class by its dotted path: `--backend my_pkg.engines.MyBackend`).

A capability an engine lacks is an explicit error, not a missing method: a hosted model's
`load_weights` raises `WeightsNotLoadable` (a 400 with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from envhub.gateway.errors import BadRequest
from envhub.gateway.structured import Constraint

if TYPE_CHECKING:
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.fleet.upstreams import UpstreamSpec


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)  # stop strings (checked on decoded text)
    stop_token_ids: list[int] = field(default_factory=list)  # besides the model's EOS
    seed: int | None = None
    top_logprobs: int = 0  # >0: also return that many alternatives per sampled token
    # structured outputs / forced tool calls (gateway/structured.py); engines that cannot
    # constrain raise BadRequest, never ignore it
    constraint: Constraint | None = None


@dataclass
class GenerateRequest:
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    session_id: str = ""  # routing key: a session sticks to one instance
    group_id: str = ""  # the session's RL group: the engine drafts from its other samples
    # the conversation, for text-only backends (hosted models); token engines ignore them
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


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
    # forward passes that produced the completion, when the engine says (envhub's engines):
    # with speculative decoding fewer than the tokens; tokens / forwards per turn
    forwards: int | None = None

    def __post_init__(self) -> None:
        assert len(self.completion_ids) == len(self.logprobs), (
            f"{len(self.completion_ids)} completion ids vs {len(self.logprobs)} logprobs"
        )


class WeightsNotLoadable(BadRequest):
    """This engine cannot load weights (a hosted model, a scripted fake); the message says why."""


@runtime_checkable
class Backend(Protocol):
    """An inference engine, or a fleet of them, that samples from token ids."""

    name: str  # the kind, e.g. "vllm"; "fleet" for a fleet
    instance: str  # this engine's name on /metrics, in the pool's turns and in a fleet
    # Version of the weights it samples from now; stamped on results of engines that do not
    # report their own. The fleet sets it when weights were pushed out of band (vLLM's NCCL).
    weight_version: int

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample one completion; errors are gateway errors (router.py retries
        BackendUnavailable and Overloaded on another instance)."""
        ...

    async def health(self) -> dict[str, Any]:
        """A cheap probe (heartbeats, GET /health); raises BackendUnavailable when down."""
        ...

    async def load_weights(self, path: str, version: int | None = None) -> int:
        """Swap in the checkpoint at `path` (as the engine sees it) between batches; returns
        the new weight version (`version`, default current + 1). Raises WeightsNotLoadable
        when this engine cannot."""
        ...

    async def aclose(self) -> None: ...


class BackendClass(Protocol):
    """The class side: how the gateway builds a backend named by `GatewayConfig.backend`."""

    # True: one instance per upstream URL (--upstream / --fleet-config), routed as a fleet;
    # False: one engine in this process, built from the config alone.
    remote: bool
    # True: the engine takes chat messages and answers text (hosted models); turns are
    # recorded as text and not trainable.
    text_only: bool

    def from_config(self, config: GatewayConfig, upstream: UpstreamSpec | None) -> Backend:
        """Build one backend; `upstream` is given exactly when `remote` is True."""
        ...


def refuse_constraint(request: GenerateRequest, engine: str) -> None:
    """For engines that cannot constrain their output: a clear 400 instead of silence."""
    if request.params.constraint is not None:
        raise BadRequest(f"the {engine} engine cannot constrain its output: response_format "
                         "json and forced tool calls (tool_choice 'required' or a named "
                         "function, parallel_tool_calls false) need the local, vllm or sglang "
                         "backend")
