"""Responses API items ⇄ the chat messages every route renders through (ChatService).

The conversion is chosen so that a client echoing our output items back (as the OpenAI Agents
SDK and Codex do) produces the very assistant message we recorded: the `output_text` of the
message item is the parsed content, the `function_call` items are its tool calls in order.
Such an echo hashes like the recorded response, so the next request extends the token history
(same segment, only the appended items rendered) instead of becoming a context action.

Grouping: the assistant items of one response — reasoning, then a message, then function calls
— form one assistant message. A message item after text or calls, a reasoning item after
anything, or any non-assistant item starts a new message.
"""

from __future__ import annotations

from typing import Any

import orjson

from envhub.gateway.errors import BadRequest
from envhub.gateway.models.responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    MessageItem,
    ReasoningItem,
    ToolChoiceFunction,
)
from envhub.gateway.service import Choice, response_id

Message = dict[str, Any]


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.refusal if p.type == "refusal" else p.text for p in content)


def _arguments(item: FunctionCallItem, where: str) -> str:
    """`arguments` must be the JSON text of an object (empty text: no arguments)."""
    if not item.arguments.strip():
        return "{}"
    try:
        parsed = orjson.loads(item.arguments)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise BadRequest(f"{where}.arguments must be the JSON text of an object; got "
                         f"{item.arguments[:80]!r}", param=f"{where}.arguments")
    return item.arguments


def to_messages(instructions: str | None, items: list[Any]) -> list[Message]:
    """`instructions` + input items → OpenAI-shaped chat messages (normalised later by the
    chat pipeline, as the chat route's are). Raises BadRequest naming the item."""
    out: list[Message] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    open_turn: Message | None = None  # the assistant message items are being added to
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if isinstance(item, MessageItem) and item.role == "assistant":
            if open_turn is None or open_turn["content"] or open_turn.get("tool_calls"):
                open_turn = {"role": "assistant", "content": ""}
                out.append(open_turn)
            open_turn["content"] = _text(item.content)
        elif isinstance(item, FunctionCallItem):
            if open_turn is None:
                open_turn = {"role": "assistant", "content": ""}
                out.append(open_turn)
            open_turn.setdefault("tool_calls", []).append({
                "id": item.call_id, "type": "function",
                "function": {"name": item.name, "arguments": _arguments(item, where)}})
        elif isinstance(item, ReasoningItem):
            text = "\n\n".join(p.text for p in (item.content or item.summary))
            open_turn = {"role": "assistant", "content": ""}
            if text:
                open_turn["reasoning_content"] = text
            out.append(open_turn)
        elif isinstance(item, FunctionCallOutputItem):
            open_turn = None
            out.append({"role": "tool", "tool_call_id": item.call_id,
                        "content": _text(item.output)})
        else:
            assert isinstance(item, MessageItem), item
            open_turn = None
            out.append({"role": item.role, "content": _text(item.content)})
    # a reasoning item nobody followed up is context, not a turn: drop empty assistant shells
    return [m for m in out if m["role"] != "assistant" or m["content"] or m.get("tool_calls")
            or m.get("reasoning_content")]


def to_tools(tools: list[FunctionTool] | None) -> list[dict[str, Any]] | None:
    """Flat Responses function tools → chat-completions tools (what templates render)."""
    if not tools:
        return None
    out = []
    for tool in tools:
        fn: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            fn["description"] = tool.description
        fn["parameters"] = tool.parameters or {"type": "object", "properties": {}}
        if fn["parameters"].get("type", "object") != "object":
            raise BadRequest(f"tool {tool.name!r}: parameters must be a JSON Schema object "
                             "({'type': 'object', 'properties': {...}})", param="tools")
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | ToolChoiceFunction | None) -> Any:
    """Responses `tool_choice` → the chat route's form (validated there)."""
    if isinstance(choice, ToolChoiceFunction):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


# -- output ------------------------------------------------------------------------------------

def output_items(choice: Choice, status: str, logprobs: list[dict[str, Any]] | None
                 ) -> list[dict[str, Any]]:
    """A sampled answer as output items: one message (its text, possibly empty, so that the
    echo keeps the assistant turn), then one function_call per parsed tool call."""
    items: list[dict[str, Any]] = []
    text = choice.parsed.content or ""
    if text or not choice.tool_calls:
        items.append({"id": f"msg_{response_id()}", "type": "message", "status": status,
                      "role": "assistant", "content": [{
                          "type": "output_text", "text": text, "annotations": [],
                          "logprobs": logprobs or []}]})
    for call in choice.tool_calls:
        items.append({"id": f"fc_{response_id()}", "type": "function_call", "status": status,
                      "call_id": call["id"], "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"]})
    return items


def with_ids(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as stored and listed (/input_items): JSON, each with an id."""
    prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "reasoning": "rs"}
    out = []
    for item in items:
        data = item.model_dump(exclude_none=True)
        if not data.get("id"):
            data["id"] = f"{prefix[item.type]}_{response_id()}"
        out.append(data)
    return out
