"""Request bodies of /v1/chat/completions and /v1/completions.

Top-level fields, tools and tool_choice are validated here, on every call (cheap: no field
recurses into user data). Each message is validated by `normalize_message` when the session
first sees it (render/messages.py: the history an agent resends every turn is not checked
again, so the cost stays ∝ new messages); the schema below only describes messages.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from envhub.gateway.models.base import Body, described_as

MAX_TOKENS = 1 << 20
_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class _Loose(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


# -- described only (see the module docstring) -------------------------------------------------

class TextPart(_Loose):
    type: Literal["text"]
    text: str


class CalledFunction(_Loose):
    name: str
    arguments: str = Field(description="JSON text of an object")


class ToolCall(_Loose):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Loose):
    """A chat message (text models: content is text or text parts)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="assistant messages")
    tool_call_id: str | None = Field(None, description="tool messages: the call answered")
    reasoning_content: str | None = None


class JsonSchemaSpec(_Loose):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Loose):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


# -- validated -----------------------------------------------------------------------------------

class ChatFunctionSpec(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    name: str = Field(pattern=_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v and v.get("type", "object") != "object":
            raise ValueError("must be a JSON Schema object ({'type': 'object', "
                             "'properties': {...}})")
        return v


class ChatFunctionTool(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    type: Literal["function"] = "function"
    function: ChatFunctionSpec


class ChatNamedFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    name: str


class ChatToolChoiceFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    type: Literal["function"]
    function: ChatNamedFunction


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    include_usage: bool | None = None


Stop = Annotated[str, Field(min_length=1)]


class Sampling(Body):
    """Fields both completion routes take."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: Stop | Annotated[list[Stop], Field(max_length=16)] | None = None
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 63) - 1)
    n: int | None = Field(None, ge=1, le=16)
    stream: bool | None = None
    return_token_ids: bool | None = Field(None, description="envhub: the sampled token ids")
    # accepted and not used (named in x-envhub-ignored)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    UNUSED: ClassVar[tuple[str, ...]] = ("frequency_penalty", "presence_penalty",
                                         "logit_bias", "user")
    REQUIRED: ClassVar[dict[str, str]] = {
        "model": "'model' is required; GET /v1/models lists the served models"}
    HINTS: ClassVar[dict[str, str]] = {
        "model": "'model' must be a non-empty string; GET /v1/models lists the served models",
        "max_tokens": f"'max_tokens' must be an integer in [1, {MAX_TOKENS}]",
        "temperature": "'temperature' must be a number in [0.0, 2.0]",
        "top_p": "'top_p' must be a number in (0, 1]",
        "stop": "'stop' must be a non-empty string or a list of up to 16 of them",
        "seed": "'seed' must be a 64-bit integer",
        "n": "'n' must be an integer in [1, 16]",
        "frequency_penalty": "'frequency_penalty' must be a number in [-2.0, 2.0]",
        "presence_penalty": "'presence_penalty' must be a number in [-2.0, 2.0]",
    }


_MESSAGES = ("'messages' must be a non-empty list of messages ({'role': ..., 'content': "
             "...})")
_TOOL_CHOICE = ("'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', "
                "'function': {'name': ...}}")


class ChatRequest(Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Any], Field(min_length=1),
                        WithJsonSchema(described_as(ChatMessage, min_items=1))]
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    tools: list[ChatFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ChatToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    response_format: Annotated[dict[str, Any] | None,
                               WithJsonSchema(described_as(ResponseFormat, nullable=True))] = None
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # accepted and not used (named in x-envhub-ignored)
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    UNUSED: ClassVar[tuple[str, ...]] = Sampling.UNUSED + (
        "metadata", "store", "service_tier", "reasoning_effort", "prompt_cache_key",
        "safety_identifier")
    DEEP: ClassVar[frozenset[str]] = frozenset({"tools", "stream_options"})
    HINTS: ClassVar[dict[str, str]] = {
        **Sampling.HINTS,
        "messages": _MESSAGES,
        "max_completion_tokens": f"'max_completion_tokens' must be an integer in "
                                 f"[1, {MAX_TOKENS}]",
        "tools": "'tools' must be a list of function tools ({'type': 'function', "
                 "'function': {'name', 'parameters'}})",
        "tool_choice": _TOOL_CHOICE,
        "response_format": "'response_format' must be an object ({'type': 'text' | "
                           "'json_object' | 'json_schema', ...})",
        "stream_options": "'stream_options' must be an object ({'include_usage': true})",
        "top_logprobs": "'top_logprobs' must be an integer in [0, 20]",
    }


class CompletionRequest(Sampling):
    """POST /v1/completions (one prompt per request)."""

    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    logprobs: int | None = Field(None, ge=0, le=20, description="top-k logprobs per token")
    # accepted and not used (named in x-envhub-ignored)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    UNUSED: ClassVar[tuple[str, ...]] = Sampling.UNUSED + ("echo", "suffix", "best_of")
    HINTS: ClassVar[dict[str, str]] = {
        **Sampling.HINTS,
        "prompt": "'prompt' must be a string or a non-empty list of token ids (one prompt "
                  "per request)",
        "logprobs": "'logprobs' must be an integer in [0, 20]",
    }
