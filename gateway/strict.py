"""OpenAI's strict mode for JSON schemas, applied before a schema becomes a sampling constraint.

`strict: true` on `response_format.json_schema` (Responses: `text.format`) or on a function tool
means, as OpenAI defines it: every object is closed (`additionalProperties: false`) and lists
every property in `required`. OpenAI refuses a strict schema that does not say so itself; many
clients send one anyway (instructor, LangChain and the llm CLI pass pydantic's
`model_json_schema()`, which leaves `additionalProperties` out and defaulted fields out of
`required`), and llguidance reads a missing `additionalProperties` as "any other key allowed".
So we close such schemas rather than refuse them: the client asked for strict and gets what
strict means (no extra keys, every key present; optional fields are emulated, as OpenAI
documents, by a type that allows null).

What strict mode does not support is a 400 naming the keyword and where it is, as OpenAI
answers, never silent looseness: composition other than `anyOf` (`allOf`, `oneOf`, `not`,
`if`/`then`/`else`, `dependentRequired`, `dependentSchemas`), open objects (`patternProperties`,
`unevaluatedProperties`, `propertyNames`, `additionalProperties` other than false), and a root
that is not an object (a root `anyOf` included). A one-schema `allOf` (older pydantic's wrapper
around a `$ref` with a description) means the same as its schema and is unwrapped. Supported and
passed on: the JSON types, `enum` / `const`, `anyOf` below the root, `$defs` / `$ref` (recursion
included), and the bounds `pattern`, `format`, `minimum` / `maximum` (and exclusive),
`multipleOf`, `minItems` / `maxItems`, `minLength` / `maxLength` (llguidance enforces them; OpenAI
refuses some of them for fine-tuned models only). OpenAI's size limits (properties, nesting, enum
values) are not checked here.

Calls under `tool_choice: auto` are sampled without a grammar (every turn would otherwise record
post-mask logprobs, gateway/structured.py). A strict function's arguments are checked after the
fact instead (`StrictArguments`: the closed schema, JSON Schema 2020-12, `format` not asserted):
a call that does not match never reaches the client as a call; the service answers the text as
content with an `invalid_tool_arguments` signal, as it does for a call to an undeclared tool.
"""

from __future__ import annotations

from typing import Any

import orjson
from jsonschema import Draft202012Validator

from envhub.gateway.errors import BadRequest

_UNSUPPORTED = ("allOf", "oneOf", "not", "if", "then", "else", "dependentRequired",
                "dependentSchemas", "patternProperties", "unevaluatedProperties", "propertyNames")
_FIX = {"oneOf": "use anyOf", "allOf": "merge the schemas into one"}
_SCHEMA_MAPS = ("properties", "$defs", "definitions")  # name → subschema
_SCHEMA_LISTS = ("anyOf", "prefixItems")


def strict_schema(schema: dict[str, Any], what: str, param: str) -> dict[str, Any]:
    """`schema` with strict mode's meaning made explicit (a copy; objects closed, every property
    required); 400 (`param`) naming what strict mode does not support. `what` names the schema
    in the message ("response_format's schema", "function 'f' parameters")."""
    root = _resolve_root(schema)
    if "anyOf" in root or not _is_object(root):
        raise BadRequest(f"{what}: with strict true the root must be an object schema "
                         "({'type': 'object', 'properties': {...}}), not anyOf or another type; "
                         "wrap it in an object's property", param=param)
    return _close(schema, "", what, param)


def _close(node: Any, at: str, what: str, param: str) -> Any:
    if not isinstance(node, dict):
        return node
    node = _unwrap_all_of(node)
    for key in _UNSUPPORTED:
        if key in node:
            fix = _FIX.get(key, "remove it")
            raise BadRequest(f"{what}: strict mode does not support {key!r} (at {at or 'the root'})"
                             f"; {fix}, or send strict false", param=param)
    out = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {k: _close(v, _at(at, f"{key}.{k}"), what, param)
                        for k, v in node[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_close(v, _at(at, f"{key}[{i}]"), what, param)
                        for i, v in enumerate(node[key])]
    if "items" in node:
        out["items"] = _close(node["items"], _at(at, "items"), what, param)
    if _is_object(node):
        if node.get("additionalProperties", False) is not False:
            raise BadRequest(f"{what}: strict mode needs closed objects, but "
                             f"{at or 'the root'} has additionalProperties "
                             f"{node['additionalProperties']!r}; drop it or set it to false (a "
                             "map of free keys is not expressible in strict mode)", param=param)
        out["additionalProperties"] = False
        out["required"] = list(node.get("properties") or {})
    return out


def _at(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def _unwrap_all_of(node: dict[str, Any]) -> dict[str, Any]:
    parts = node.get("allOf")
    if isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], dict):
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return {**parts[0], **rest}
    return node


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or (
        kind is None and "properties" in node)


def _resolve_root(schema: dict[str, Any]) -> dict[str, Any]:
    """The root, or what a root `$ref` into `$defs` names (pydantic writes recursive models so)."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
        _, bucket, name = ref.split("/", 2)
        target = (schema.get(bucket) or {}).get(name)
        if isinstance(target, dict):
            return target
    return schema


class StrictArguments:
    """Validators of the strict functions' arguments of one tool list; a 400 (as for a forced
    call) when a strict function's schema uses what strict mode does not support."""

    def __init__(self, tools: list[dict[str, Any]], strict: frozenset[str]):
        self.validators: dict[str, Draft202012Validator] = {}
        for tool in tools:
            fn = tool["function"]
            if fn["name"] in strict:
                schema = strict_schema(fn.get("parameters") or {"type": "object"},
                                       f"function {fn['name']!r} parameters", "tools")
                self.validators[fn["name"]] = Draft202012Validator(schema)

    def error(self, name: str, arguments: str) -> str | None:
        """Why this call's arguments break its function's strict schema, or None (also for a
        function that is not strict)."""
        validator = self.validators.get(name)
        if validator is None:
            return None
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return "the arguments are not valid JSON"
        err = next(iter(validator.iter_errors(value)), None)
        if err is None:
            return None
        where = "/".join(str(p) for p in err.absolute_path) or "the arguments"
        return f"{where}: {err.message[:300]}"


_CHECKS: dict[tuple[bytes, frozenset[str]], StrictArguments] = {}
_MAX_CHECKS = 256  # tool lists remembered (an agent sends the same tools every turn)


def strict_arguments(tools: list[dict[str, Any]] | None, strict: frozenset[str],
                     tools_key: bytes) -> StrictArguments | None:
    """The checks for `strict` (function names) of `tools` (hashed as `tools_key`), built once
    per tool list; None when no declared function is strict."""
    if not strict or not tools:
        return None
    key = (tools_key, strict)
    check = _CHECKS.get(key)
    if check is None:
        check = StrictArguments(tools, strict)
        if len(_CHECKS) >= _MAX_CHECKS:
            _CHECKS.pop(next(iter(_CHECKS)))
        _CHECKS[key] = check
    return check


def strict_names(tools: list[dict[str, Any]] | None) -> frozenset[str]:
    """The functions of an OpenAI-shaped tool list that say `strict: true`."""
    return frozenset(t["function"]["name"] for t in tools or []
                     if t.get("function", {}).get("strict") is True)
