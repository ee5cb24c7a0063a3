"""Request bodies of /v1/messages and /v1/messages/count_tokens.

Top-level fields and tool_choice are validated here; content blocks and tools are converted and
checked block by block in anthropic_convert.py (each error names its block), and described
below for `/openapi.json`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from envhub.gateway.models.base import Body, described_as

MAX_TOKENS = 1 << 20


class _Loose(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


# -- described only --------------------------------------------------------------------------

class ContentBlock(_Loose):
    """text, tool_use (assistant), tool_result (user) or thinking; text models only."""

    type: Literal["text", "tool_use", "tool_result", "thinking", "redacted_thinking"]
    text: str | None = None
    id: str | None = Field(None, description="tool_use")
    name: str | None = Field(None, description="tool_use")
    input: dict[str, Any] | None = Field(None, description="tool_use")
    tool_use_id: str | None = Field(None, description="tool_result")
    content: str | list[dict[str, Any]] | None = Field(None, description="tool_result")
    is_error: bool | None = Field(None, description="tool_result")
    thinking: str | None = None


class AnthropicMessage(_Loose):
    # 'system' after the first message: mid-conversation instructions (Claude Code sends them)
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class AnthropicTool(_Loose):
    """A client tool (server tools such as web_search are refused)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    strict: bool | None = Field(None, description="strict tool use: the call's input matches "
                                "input_schema (closed objects, every property required)")


class AnthropicToolChoice(_Loose):
    """Validated (the conversion reads the raw object)."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, description="type 'tool': the tool to call")
    disable_parallel_tool_use: bool | None = None


# -- validated -----------------------------------------------------------------------------------

class CountTokensRequest(Body):
    """POST /v1/messages/count_tokens (and the prompt part of /v1/messages)."""

    model: str = Field(min_length=1)
    messages: Annotated[list[Any], Field(min_length=1),
                        WithJsonSchema(described_as(AnthropicMessage, min_items=1))]
    system: str | list[dict[str, Any]] | None = None
    tools: Annotated[list[dict[str, Any]] | None,
                     WithJsonSchema(described_as(AnthropicTool, min_items=0, nullable=True))] = None
    tool_choice: AnthropicToolChoice | None = None
    # JSON outputs: `format` {'type': 'json_schema', 'schema': {...}} (anthropic_convert.py);
    # `output_format` is the same from the structured-outputs beta
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None
    # accepted and not used (named in x-envhub-ignored)
    thinking: dict[str, Any] | None = None

    UNUSED: ClassVar[tuple[str, ...]] = ("thinking",)
    REQUIRED: ClassVar[dict[str, str]] = {
        "model": "'model' is required; GET /v1/models lists the served models"}
    HINTS: ClassVar[dict[str, str]] = {
        "model": "'model' must be a non-empty string; GET /v1/models lists the served models",
        "messages": "'messages' must be a non-empty list of {'role': 'user' | 'assistant', "
                    "'content': ...}",
        "system": "system.content must be a string or a list of content blocks ({'type': "
                  "'text', 'text': ...})",
        "tools": "'tools' must be a list of {'name', 'description', 'input_schema'}",
        "tool_choice": "'tool_choice' must be {'type': 'auto' | 'any' | 'none'} or "
                       "{'type': 'tool', 'name': ...}",
        "thinking": "'thinking' must be an object",
        "output_config": "'output_config' must be an object ({'format': {'type': "
                         "'json_schema', 'schema': {...}}})",
        "output_format": "'output_format' must be {'type': 'json_schema', 'schema': {...}}",
    }


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1, le=MAX_TOKENS)
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1)]],
                              Field(max_length=16)] | None = None
    # Anthropic caps temperature at 1; the engines take up to 2 (as on the OpenAI route)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool | None = None
    # accepted and not used (named in x-envhub-ignored)
    top_k: int | None = Field(None, ge=0, le=MAX_TOKENS)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    UNUSED: ClassVar[tuple[str, ...]] = ("thinking", "top_k", "metadata", "service_tier")
    REQUIRED: ClassVar[dict[str, str]] = {
        **CountTokensRequest.REQUIRED,
        "max_tokens": "'max_tokens' is required: an integer >= 1 (the completion budget)"}
    HINTS: ClassVar[dict[str, str]] = {
        **CountTokensRequest.HINTS,
        "max_tokens": f"'max_tokens' must be an integer ≥ 1 and ≤ {MAX_TOKENS}",
        "stop_sequences": "'stop_sequences' must be a list of up to 16 non-empty strings",
        "temperature": "'temperature' must be a number in [0.0, 2.0]",
        "top_p": "'top_p' must be a number in (0, 1]",
        "top_k": f"'top_k' must be an integer in [0, {MAX_TOKENS}]",
        "metadata": "'metadata' must be an object",
        "service_tier": "'service_tier' must be a string",
    }
