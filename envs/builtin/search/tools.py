"""The `search` environment's tools: `search`, `open_page` and `submit` (schemas and the two
read-only calls). The oracle and the synthesis validator call the same `call` the model's tool
calls reach, so a question they solve is solvable through what the model sees."""

from __future__ import annotations

import re
from typing import Any

from envhub.envs.builtin.search.index import MAX_RESULTS, Index, SearchInputError
from envhub.envs.tools.arguments import json_object
from envhub.envs.tools.result import ToolResult

MAX_ANSWER_CHARS = 200
DEFAULT_RESULTS = 5
# One line of a search listing: "1. Title (kind): snippet"
HIT_RE = re.compile(r"^\d+\. (?P<title>.+?) \((?P<kind>[a-z]+)\): ", re.M)

SCHEMAS: dict[str, dict[str, Any]] = {
    "search": {"type": "function", "function": {
        "name": "search",
        "description": "Search the encyclopedia (BM25 over titles and text). Returns the best "
                       f"pages' titles with a snippet each (at most {MAX_RESULTS}).",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "a name or a few keywords"},
            "k": {"type": "integer", "description": f"how many results, 1 to {MAX_RESULTS} "
                                                    f"(default {DEFAULT_RESULTS})"}},
            "required": ["query"]},
    }},
    "open_page": {"type": "function", "function": {
        "name": "open_page",
        "description": "Open an encyclopedia page by its exact title (as search printed it) "
                       "and return its text.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string", "description": "e.g. 'Port Legeta'"}},
            "required": ["title"]},
    }},
    "submit": {"type": "function", "function": {
        "name": "submit",
        "description": "Submit the final answer (a name, a word or a number) and end the "
                       "episode.",
        "parameters": {"type": "object", "properties": {
            "answer": {"type": "string", "description": "the answer only, e.g. '1848'"}},
            "required": ["answer"]},
    }},
}
EXAMPLES = {"search": '{"query": "Port Legeta"}', "open_page": '{"title": "Port Legeta"}',
            "submit": '{"answer": "1848"}'}


def call(index: Index, name: str, arguments: str) -> ToolResult:
    """Run `search` or `open_page` with the model's JSON `arguments`; mistakes come back as
    error results that say how to call the tool right."""
    args = json_object(name, arguments, EXAMPLES.get(name, "{}"))
    if isinstance(args, ToolResult):
        return args
    try:
        if name == "search":
            return _search(index, args)
        if name == "open_page":
            return _open(index, args)
    except SearchInputError as e:
        return ToolResult(f"error: {e}", is_error=True)
    return ToolResult(f"unknown tool {name!r}; use search, open_page or submit", is_error=True)


def _search(index: Index, args: dict[str, Any]) -> ToolResult:
    query, k = args.get("query"), args.get("k", DEFAULT_RESULTS)
    if not isinstance(query, str):
        return ToolResult(f"pass the query as a string, e.g. {EXAMPLES['search']}",
                          is_error=True)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_RESULTS:
        return ToolResult(f"k must be a whole number from 1 to {MAX_RESULTS}", is_error=True)
    hits = index.search(query, k)
    if not hits:
        return ToolResult(f"no pages match {query[:80]!r}; try other words")
    return ToolResult("\n".join(f"{i}. {h.title} ({h.kind}): {h.snippet}"
                                for i, h in enumerate(hits, 1)))


def _open(index: Index, args: dict[str, Any]) -> ToolResult:
    title = args.get("title")
    if not isinstance(title, str) or not title.strip():
        return ToolResult(f"pass the page title as a string, e.g. {EXAMPLES['open_page']}",
                          is_error=True)
    text = index.page(title)
    if text is not None:
        return ToolResult(text)
    near = ", ".join(h.title for h in index.search(title, 3)) if re.search(r"\w", title) else ""
    return ToolResult(f"no page titled {title[:80]!r}" + (f"; did you mean: {near}?" if near
                      else "; search first and use a title it prints"), is_error=True)


def hit_titles(listing: str) -> list[str]:
    """The titles of a search listing, in rank order."""
    return [m["title"] for m in HIT_RE.finditer(listing)]


def read_answer(arguments: str) -> str | ToolResult:
    """A `submit` call's answer (stripped, bounded), or the error result to send back."""
    args = json_object("submit", arguments, EXAMPLES["submit"])
    if isinstance(args, ToolResult):
        return args
    answer = args.get("answer")
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        return ToolResult(f"pass the final answer as a string, e.g. {EXAMPLES['submit']}",
                          is_error=True)
    if len(answer) > MAX_ANSWER_CHARS:
        return ToolResult(f"answer longer than {MAX_ANSWER_CHARS} characters; submit the "
                          "answer only (one name, word or number)", is_error=True)
    return answer.strip()
