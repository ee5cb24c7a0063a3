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
    NamespaceTool,
    ReasoningItem,
    ToolChoiceFunction,
    qualified_name,
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
            name = item.name if item.namespace is None else qualified_name(item.namespace,
                                                                            item.name)
            open_turn.setdefault("tool_calls", []).append({
                "id": item.call_id, "type": "function",
                "function": {"name": name, "arguments": _arguments(item, where)}})
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


def flat_tools(tools: list[FunctionTool | NamespaceTool] | None
               ) -> list[tuple[str | None, FunctionTool]]:
    """(namespace, tool) of every function tool, those of namespace tools included."""
    out: list[tuple[str | None, FunctionTool]] = []
    for tool in tools or []:
        if isinstance(tool, NamespaceTool):
            out += [(tool.name, t) for t in tool.tools]
        else:
            out.append((None, tool))
    return out


def namespaced(tools: list[FunctionTool | NamespaceTool] | None) -> dict[str, tuple[str, str]]:
    """The model's name of each namespaced tool -> (namespace, the tool's own name)."""
    return {qualified_name(ns, t.name): (ns, t.name) for ns, t in flat_tools(tools)
            if ns is not None}


def to_tools(tools: list[FunctionTool | NamespaceTool] | None) -> list[dict[str, Any]] | None:
    """Responses function tools → chat-completions tools (what templates render); a namespace
    tool's functions are offered one by one under their qualified names."""
    if not tools:
        return None
    out = []
    seen: set[str] = set()
    for namespace, tool in flat_tools(tools):
        name = tool.name if namespace is None else qualified_name(namespace, tool.name)
        if name in seen:  # the model could not tell the two apart, nor could their calls
            raise BadRequest(f"two tools are offered to the model as {name!r} (a function "
                             "tool and a namespace tool's function qualify to the same name); "
                             "rename or leave one out", param="tools")
        seen.add(name)
        fn: dict[str, Any] = {"name": name}
        if tool.description is not None:
            fn["description"] = tool.description
        fn["parameters"] = tool.parameters or {"type": "object", "properties": {}}
        if fn["parameters"].get("type", "object") != "object":
            raise BadRequest(f"tool {name!r}: parameters must be a JSON Schema object "
                             "({'type': 'object', 'properties': {...}})", param="tools")
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | ToolChoiceFunction | None) -> Any:
    """Responses `tool_choice` → the chat route's form (validated there)."""
    if isinstance(choice, ToolChoiceFunction):
        name = choice.name if choice.namespace is None else qualified_name(choice.namespace,
                                                                            choice.name)
        return {"type": "function", "function": {"name": name}}
    return choice


# -- output ------------------------------------------------------------------------------------

def output_items(choice: Choice, status: str, logprobs: list[dict[str, Any]] | None,
                 namespaces: dict[str, tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """A sampled answer as output items: one message (its text, possibly empty, so that the
    echo keeps the assistant turn), then one function_call per parsed tool call (a namespaced
    tool's with its `namespace` and own name, `namespaces` from `namespaced`)."""
    items: list[dict[str, Any]] = []
    text = choice.parsed.content or ""
    if text or not choice.tool_calls:
        items.append({"id": f"msg_{response_id()}", "type": "message", "status": status,
                      "role": "assistant", "content": [{
                          "type": "output_text", "text": text, "annotations": [],
                          "logprobs": logprobs or []}]})
    for call in choice.tool_calls:
        name = call["function"]["name"]
        item = {"id": f"fc_{response_id()}", "type": "function_call", "status": status,
                "call_id": call["id"], "name": name, "arguments": call["function"]["arguments"]}
        if namespaces and name in namespaces:
            item["namespace"], item["name"] = namespaces[name]
        items.append(item)
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
