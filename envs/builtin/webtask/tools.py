"""The browser tools of `webtask`: OpenAI schemas and argument checks.

Each call becomes one run of runtime/driver.js inside the sandbox (env.py), which answers with
the page after the action: its URL, title and accessibility tree (Playwright's ARIA snapshot).
"""

from __future__ import annotations

from typing import Any

from envhub.envs.tools.arguments import json_object
from envhub.envs.tools.result import ToolResult


def _tool(tool: str, description: str, **params: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": tool, "description": description,
        "parameters": {"type": "object", "required": [p for p in params if p != "role"],
                       "properties": {p: {"type": "string", "description": d}
                                      for p, d in params.items()}}}}


AFTER = " Returns the page afterwards (URL, title, accessibility tree)."
SCHEMAS: dict[str, dict[str, Any]] = {
    "read_page": _tool("read_page", "Read the current page." + AFTER),
    "navigate": _tool("navigate", "Open a page of the app." + AFTER,
                      url="a path such as '/settings' (the app is at http://127.0.0.1:8080)"),
    "click": _tool("click", "Click a button, link or checkbox by its accessible name." + AFTER,
                   **{"name": "the exact name shown in the accessibility tree, e.g. 'Add'",
                      "role": "optional role to disambiguate: button, link, checkbox, ..."}),
    "type": _tool("type", "Replace the text of a field, found by its label." + AFTER,
                  field="the field's label, e.g. 'Email'", text="the text to put in it"),
    "select": _tool("select", "Choose an option of a drop-down, found by its label." + AFTER,
                    field="the drop-down's label, e.g. 'Theme'", option="the option's text"),
}
EXAMPLES = {"read_page": "{}", "navigate": '{"url": "/settings"}', "click": '{"name": "Add"}',
            "type": '{"field": "Email", "text": "ada@example.com"}',
            "select": '{"field": "Theme", "option": "Dark"}'}


def request(name: str, arguments: str | None) -> dict[str, Any] | ToolResult:
    """The driver's request {action, args}, or an error result for the model."""
    args = json_object(name, arguments, EXAMPLES[name])
    if isinstance(args, ToolResult):
        return args
    properties = SCHEMAS[name]["function"]["parameters"]["properties"]
    unknown = sorted(set(args) - set(properties))
    missing = [p for p in SCHEMAS[name]["function"]["parameters"]["required"] if p not in args]
    wrong = [p for p, v in args.items() if p in properties and not isinstance(v, str)]
    if unknown or missing or wrong:
        problem = (f"unknown {unknown}" if unknown else f"missing {missing}" if missing
                   else f"{wrong} must be strings")
        return ToolResult(f"bad arguments for `{name}`: {problem}; e.g. {EXAMPLES[name]}",
                          is_error=True)
    return {"action": name, "args": args}
