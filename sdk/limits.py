"""Bounds on untrusted nested data, counted before anything recurses into it.

A check that waits for `RecursionError` answers by the interpreter's state, not the input: the
recursion limit is process-wide and other code raises it at run time (torch's inductor sets at
least 2,000 when it compiles, hypothesis raises it while it runs), so the same schema was
refused in one process and accepted in another. These counts are iterative and give the same
answer for the same input in any process.
"""

from __future__ import annotations

from typing import Any


def nesting(value: Any, limit: int) -> int:
    """How many levels of dicts and lists `value` nests (a scalar: 0, `{}`: 1, `{"a": []}`: 2),
    counting no further than `limit + 1`: a value deeper than `limit` reads `limit + 1`
    however deep it goes, and is walked only that far."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if depth > limit:
            return limit + 1
        stack.extend((child, depth) for child in children)
    return deepest


def too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` levels of dicts and lists."""
    return nesting(value, limit) > limit


MAX_YAML_DEPTH = 64  # nested mappings and sequences a YAML file read from a package may hold


def yaml_too_deep(text: str, limit: int = MAX_YAML_DEPTH) -> bool:
    """Whether YAML `text` nests more than `limit` mappings and sequences, counted on PyYAML's
    token stream (its scanner does not recurse; its composer, which `safe_load` runs next, does).
    Text the scanner refuses is not too deep: `safe_load` says what is wrong with it."""
    import yaml

    opening = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken,
               yaml.FlowMappingStartToken, yaml.FlowSequenceStartToken)
    closing = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)
    depth = 0
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if isinstance(token, opening):
                depth += 1
                if depth > limit:
                    return True
            elif isinstance(token, closing):
                depth -= 1
    except yaml.YAMLError:
        return False
    return False
