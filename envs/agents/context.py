"""Context management for the built-in agent: what to do when the prompt outgrows its budget.

Both strategies keep the system and first user message and the latest `keep_last` exchanges
(an exchange = one assistant message and the tool results answering it), and act on the older
exchanges in between:
- `drop`: remove them (CMAction kind `truncate`).
- `summarize`: replace them with one user message listing the calls made and how they ended
  (CMAction kind `summarize`). Extractive, so it costs no model call and is deterministic.
The agent declares each action to its session, so the pool records it as `source=declared`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Message = dict[str, Any]
CHARS_PER_TOKEN = 3  # conservative estimate for text the model has not seen yet


@dataclass
class ContextAction:
    kind: Literal["truncate", "summarize"]
    removed: list[list[int]]  # [start, end) message ranges of the old list
    added: list[list[int]] = field(default_factory=list)  # ranges in the new list
    tokens_before: int = 0
    tokens_after: int = 0


def estimate_tokens(messages: list[Message], known_prefix_tokens: int = 0,
                    known_prefix_len: int = 0) -> int:
    """Prompt size: exact token count of a prefix the gateway already reported (usage), plus a
    character estimate for the messages after it."""
    rest = messages[known_prefix_len:]
    chars = sum(len(json.dumps(m, ensure_ascii=False)) for m in rest)
    return known_prefix_tokens + chars // CHARS_PER_TOKEN


def exchanges(messages: list[Message], start: int) -> list[tuple[int, int]]:
    """[start, end) ranges of assistant messages with their following tool results."""
    spans, i = [], start
    while i < len(messages):
        j = i + 1
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        spans.append((i, j))
        i = j
    return spans


class ContextStrategy:
    def __init__(self, kind: Literal["drop", "summarize"] = "drop", keep_last: int = 2) -> None:
        if kind not in ("drop", "summarize"):
            raise ValueError(f"context strategy {kind!r}: use 'drop' or 'summarize'")
        self.kind, self.keep_last = kind, keep_last

    def fit(self, messages: list[Message], tokens: int,
            budget: int) -> tuple[list[Message], ContextAction | None]:
        """New message list within budget (as far as keep_last allows) and the action taken."""
        if tokens <= budget:
            return messages, None
        head = 2 if len(messages) > 1 and messages[1].get("role") == "user" else 1
        spans = exchanges(messages, head)
        old = spans[: max(0, len(spans) - self.keep_last)]
        if not old:
            return messages, None
        start, end = old[0][0], old[-1][1]
        if self.kind == "drop":
            new = messages[:start] + messages[end:]
            added: list[list[int]] = []
            kind: Literal["truncate", "summarize"] = "truncate"
        else:
            summary = {"role": "user", "content": summarize(messages[start:end])}
            new = messages[:start] + [summary] + messages[end:]
            added, kind = [[start, start + 1]], "summarize"
        after = estimate_tokens(new)
        return new, ContextAction(kind, [[start, end]], added, tokens, after)


def summarize(messages: list[Message]) -> str:
    """One line per tool call: its name, arguments (cut) and whether the result was an error."""
    results = {m.get("tool_call_id"): str(m.get("content", "")) for m in messages
               if m.get("role") == "tool"}
    lines = ["Summary of earlier steps (their full output was removed to save context):"]
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            result = results.get(call.get("id"), "")
            first = result.strip().splitlines()[0][:80] if result.strip() else "(no output)"
            lines.append(f"- {fn.get('name')}({str(fn.get('arguments', ''))[:80]}) -> {first}")
        if not m.get("tool_calls") and m.get("content"):
            lines.append(f"- said: {str(m['content'])[:80]}")
    return "\n".join(lines)
