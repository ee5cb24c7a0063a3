"""Chat messages as the gateway sees them: validated, normalised, hashed.

Agents send OpenAI-shaped messages. Before rendering we normalise them to the plain dicts that
chat templates expect (`content` as a string, `tool_calls` with parsed `arguments`), and we hash
each normalised message so that "does this request extend what we sampled?" is a cheap list
comparison instead of a re-render.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from envhub.gateway.errors import BadRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
HASH_BYTES = 8


def _text_of(content: Any, where: str) -> str:
    """OpenAI content may be a string or a list of parts; templates want one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest(f"{where}.content[{j}].text must be a string", param=where)
                out.append(text)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(
                    f"{where}.content[{j}]: unsupported content part type {kind!r}; "
                    "this gateway serves text models: send text parts only",
                    param=where,
                )
        return "".join(out)
    raise BadRequest(f"{where}.content must be a string or a list of text parts", param=where)


def _tool_calls_of(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise BadRequest(f"{where}.tool_calls must be a list", param=where)
    calls = []
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(
                f"{where}.tool_calls[{j}] needs {{'type': 'function', 'function': "
                "{'name': str, 'arguments': str}}",
                param=where,
            )
        parsed = _arguments_of(fn.get("arguments", "{}"), f"{where}.tool_calls[{j}]")
        calls.append({
            "id": call.get("id") or f"call_{j}",
            "type": "function",
            "function": {"name": fn["name"], "arguments": parsed},
        })
    return calls


def _arguments_of(args: Any, where: str) -> dict[str, Any]:
    """OpenAI sends `function.arguments` as JSON text of an object; an empty string is taken
    as `{}` (clients send it for tools without parameters)."""
    if not isinstance(args, str):
        raise BadRequest(f"{where}.function.arguments must be a JSON string (e.g. "
                         f"'{{\"x\": 1}}'), not {type(args).__name__}", param=where)
    if not args.strip():
        return {}
    try:
        parsed = orjson.loads(args)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise BadRequest(f"{where}.function.arguments must be the JSON text of an object; "
                         f"got {args[:80]!r}", param=where)
    return parsed


def normalize_message(m: Any, i: int) -> dict[str, Any]:
    """Validate one OpenAI chat message; return the template-ready dict. Raises BadRequest."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise BadRequest(f"{where} must be an object", param=where)
    role = m.get("role")
    if role not in ROLES:
        raise BadRequest(
            f"{where}.role is {role!r}; use one of {', '.join(ROLES)}", param=f"{where}.role"
        )
    msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _text_of(m.get("content"), where)}
    if role == "assistant" and m.get("tool_calls"):
        msg["tool_calls"] = _tool_calls_of(m["tool_calls"], where)
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise BadRequest(f"{where}.tool_call_id is required: the id of the assistant "
                             "tool call this message answers", param=f"{where}.tool_call_id")
        msg["tool_call_id"] = call_id
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
    if role == "assistant" and isinstance(m.get("reasoning_content"), str):
        msg["reasoning_content"] = m["reasoning_content"]
    return msg


class MessageMemo:
    """Per session: raw message JSON → message hash, so that the history an agent resends every
    turn is neither re-validated nor re-normalised; only unseen messages are (cost ∝ new)."""

    def __init__(self, limit: int = 200_000):
        self._seen: dict[bytes, bytes] = {}
        self._limit = limit

    def hashes(self, raw: list[Any]) -> tuple[list[bytes], dict[int, dict[str, Any]]]:
        """(hash per message, normalised form of the messages not seen before)."""
        if len(self._seen) > self._limit:
            self._seen.clear()
        seen = self._seen
        out: list[bytes] = []
        fresh: dict[int, dict[str, Any]] = {}
        for i, m in enumerate(raw):
            key = orjson.dumps(m)
            h = seen.get(key)
            if h is None:
                fresh[i] = normalize_message(m, i)
                h = seen[key] = message_hash(fresh[i])
            out.append(h)
        return out, fresh


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=HASH_BYTES).digest()


def message_hash(msg: dict[str, Any]) -> bytes:
    """Identity of a message for prefix matching: role, text, tool calls (ids ignored: agents
    echo them but templates do not render them)."""
    key: list[Any] = [msg["role"], msg.get("content") or ""]
    if msg.get("tool_calls"):
        key.append([[c["function"]["name"], c["function"]["arguments"]] for c in msg["tool_calls"]])
    if msg.get("name"):
        key.append(msg["name"])
    return _digest(orjson.dumps(key, option=orjson.OPT_SORT_KEYS))


def tools_hash(tools: list[dict[str, Any]] | None) -> bytes:
    try:
        return _digest(orjson.dumps(tools or [], option=orjson.OPT_SORT_KEYS))
    except orjson.JSONEncodeError:  # deeper than orjson writes (254 levels)
        raise BadRequest("'tools' nest deeper than 254 levels; flatten the schemas",
                         param="tools") from None


def chain(prev: bytes, item: bytes) -> bytes:
    """Rolling hash: chain(h(prefix), h(next)) identifies the whole prefix."""
    return _digest(prev + item)
