"""The /v1/responses request body as a pydantic model: it validates (a 400 in OpenAI's error
shape naming the field, see server.py) and it is the body schema /openapi.json publishes.

Strict: a JSON boolean is a boolean (`"stream": "false"` is refused, not truthy) and numbers
are range-checked. Unknown top-level fields are kept (`extra="allow"`) and named in the
`x-envhub-ignored` response header; unknown fields inside items are dropped, as clients echo
output items back with fields of their own (`status`, `annotations`, `provider_data`, ...).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

_MAX_TOKENS = 1 << 20


class _Part(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class InputText(_Part):
    type: Literal["input_text"]
    text: str


class OutputText(_Part):
    type: Literal["output_text"]
    text: str


class Refusal(_Part):
    type: Literal["refusal"]
    refusal: str


# text models only: image, file and audio parts are refused with the tags that are allowed
ContentPart = Annotated[InputText | OutputText | Refusal, Field(discriminator="type")]
Content = str | list[ContentPart]


class MessageItem(_Part):
    """A message: the easy form `{role, content}` or an item `{type: "message", ...}`
    (assistant messages echoed back carry `output_text` parts)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content
    id: str | None = None


class FunctionCallItem(_Part):
    """A tool call the model made (echoed back by the client); `namespace` when the tool is one
    of a namespace tool's (Codex's MCP tools: namespace `mcp__SERVER`, name the tool's)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str  # JSON text of an object
    id: str | None = None
    namespace: str | None = None


class FunctionCallOutputItem(_Part):
    """The result of a tool call, answering `call_id`."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Content
    id: str | None = None


class SummaryText(_Part):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Part):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Part):
    """Reasoning the model produced; its text is rendered where the template renders it."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


def _item_tag(v: Any) -> str | None:
    """Items without `type` are easy-form messages."""
    if isinstance(v, dict):
        kind = v.get("type")
        return "message" if kind is None and "role" in v else kind
    return getattr(v, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_tag, custom_error_type="invalid_item",
                  custom_error_message="an input item must be a message ({'role', "
                  "'content'}), function_call, function_call_output or reasoning item"),
]


class FunctionTool(_Part):
    """A function tool in the Responses shape (flat: no nested `function` object)."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(_Part):
    """Function tools grouped under a name (Codex offers each MCP server's tools so). The model
    sees each as one function named `qualified_name(namespace, name)`; its calls come back as
    `function_call` items with `namespace` and the tool's own `name`."""

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    tools: list[FunctionTool]


def _tool_tag(v: Any) -> str:
    """Capitalised tags: error paths name the field (`tools[0].name`), not the alternative."""
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return "NamespaceTool" if kind == "namespace" else "FunctionTool"


Tool = Annotated[Annotated[FunctionTool, Tag("FunctionTool")]
                 | Annotated[NamespaceTool, Tag("NamespaceTool")], Discriminator(_tool_tag)]


def qualified_name(namespace: str, name: str) -> str:
    """The one function name a namespaced tool is offered to the model as:
    `mcp__envhub` + `submit` -> `mcp__envhub__submit` (as Claude Code names MCP tools)."""
    return namespace + name if namespace.endswith("__") else f"{namespace}__{name}"


class ToolChoiceFunction(_Part):
    type: Literal["function"]
    name: str
    namespace: str | None = None


class TextFormat(_Part):
    """`text.format`: json_schema carries its fields flat (name, schema, strict)."""

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    def chat_form(self) -> dict[str, Any]:
        """The chat route's `response_format` for the same request."""
        if self.type != "json_schema":
            return {"type": self.type}
        spec: dict[str, Any] = {} if self.name is None else {"name": self.name}
        if self.json_schema is not None:
            spec["schema"] = self.json_schema
        if self.strict is not None:
            spec["strict"] = self.strict
        return {"type": "json_schema", "json_schema": spec}


class TextConfig(_Part):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(BaseModel):
    """POST /v1/responses."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str = Field(min_length=1)
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=_MAX_TOKENS)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16)
    store: bool | None = None
    stream: bool | None = None
    background: bool | None = None
    text: TextConfig | None = None
    # accepted and not used (named in x-envhub-ignored when set)
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None

    def ignored(self) -> list[str]:
        """Fields the client set that do not change what this gateway does."""
        unused = ("reasoning", "truncation", "user", "service_tier", "prompt_cache_key",
                  "safety_identifier", "stream_options")
        names = [k for k in unused if getattr(self, k) is not None]
        names += [k for k, v in (self.model_extra or {}).items() if v is not None]
        if self.text is not None and self.text.verbosity is not None:
            names.append("text.verbosity")
        return sorted(names)
