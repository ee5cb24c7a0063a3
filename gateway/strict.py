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
fact instead (`StrictArguments`: no undeclared key, and the schema's types, enums, bounds and
own `required`; not `pattern` or `format`): a call that does not match never reaches the client
as a call; the service answers the text as content with an `invalid_tool_arguments` signal, as
it does for a call to an undeclared tool.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import orjson
from jsonschema import Draft202012Validator, validators
from referencing import Registry

from envhub.gateway.errors import BadRequest
from envhub.sdk.limits import too_deep

log = logging.getLogger("envhub.gateway")

_UNSUPPORTED = ("allOf", "oneOf", "not", "if", "then", "else", "dependentRequired",
                "dependentSchemas", "patternProperties", "unevaluatedProperties", "propertyNames")
_FIX = {"oneOf": "use anyOf", "allOf": "merge the schemas into one"}
_SCHEMA_MAPS = ("properties", "$defs", "definitions")  # name → subschema
_SCHEMA_LISTS = ("anyOf", "prefixItems")
# Levels of JSON objects and arrays a strict schema may nest (an object property is two: the
# `properties` map and the property's schema), counted before anything recurses into it, so
# the answer does not depend on the interpreter's recursion limit (sdk/limits.py). 64 is 31
# nested objects, far past OpenAI's documented 10; the metaschema check of a schema this deep
# stays well inside Python's default limit (measured: 333 frames from an empty stack, of
# the default 1,000). Arguments are bounded alike (a recursive `$ref` admits any depth).
MAX_SCHEMA_DEPTH = 64


def strict_schema(schema: dict[str, Any], what: str, param: str, *,
                  require_all: bool = True) -> dict[str, Any]:
    """`schema` with strict mode's meaning made explicit (a copy; objects closed, every property
    required); 400 (`param`) naming what strict mode does not support. `what` names the schema
    in the message ("response_format's schema", "function 'f' parameters"). `require_all`
    False keeps each object's `required` as the schema says (StrictArguments)."""
    if too_deep(schema, MAX_SCHEMA_DEPTH):
        raise BadRequest(f"{what}: nested too deeply to check (more than {MAX_SCHEMA_DEPTH} "
                         "levels of objects and arrays); flatten it", param=param)
    root = _resolve_root(schema)
    if "anyOf" in root or not _is_object(root):
        raise BadRequest(f"{what}: with strict true the root must be an object schema "
                         "({'type': 'object', 'properties': {...}}), not anyOf or another type; "
                         "wrap it in an object's property", param=param)
    return _close(schema, "", what, param, require_all)


def _close(node: Any, at: str, what: str, param: str, require_all: bool = True) -> Any:
    if not isinstance(node, dict):
        return node
    node = _unwrap_all_of(node)
    for key in _UNSUPPORTED:
        if key in node:
            fix = _FIX.get(key, "remove it")
            raise BadRequest(f"{what}: strict mode does not support {key!r} (at {at or 'the root'})"
                             f"; {fix}, or send strict false", param=param)
    ref = node.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        raise BadRequest(f"{what}: $ref {str(ref)[:80]!r} (at {at or 'the root'}) is not a "
                         "reference inside the schema ('#/$defs/...'); strict mode resolves "
                         "no other", param=param)
    out = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {k: _close(v, _at(at, f"{key}.{k}"), what, param, require_all)
                        for k, v in node[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_close(v, _at(at, f"{key}[{i}]"), what, param, require_all)
                        for i, v in enumerate(node[key])]
    if "items" in node:
        out["items"] = _close(node["items"], _at(at, "items"), what, param, require_all)
    if _is_object(node):
        if node.get("additionalProperties", False) is not False:
            raise BadRequest(f"{what}: strict mode needs closed objects, but "
                             f"{at or 'the root'} has additionalProperties "
                             f"{node['additionalProperties']!r}; drop it or set it to false (a "
                             "map of free keys is not expressible in strict mode)", param=param)
        out["additionalProperties"] = False
        if require_all:
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


def _skip(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    return iter(())


# JSON Schema 2020-12 without `pattern`: Python's `re` backtracks (a client's `^(a+)+$` against
# the model's output would hold the event loop for hours) and is not JSON Schema's ECMA-262
# dialect (`\p{L}` is an error there); a sampled call is not checked against patterns.
_Checker = validators.extend(Draft202012Validator, {"pattern": _skip})
_META = Draft202012Validator(Draft202012Validator.META_SCHEMA)  # no format checks (no regexes)


class StrictArguments:
    """Checks of the strict functions' arguments of one tool list, for calls sampled without a
    grammar: objects closed (no key the schema does not declare) and the types, enums, bounds
    and `required` keys the schema states. `required` is the schema's own, not strict mode's
    "every property" (that is what a forced call's grammar enforces; here the model saw the
    client's schema, where an omitted property is optional). `pattern` and `format` are not
    checked. A schema strict mode does not support, that is not valid JSON Schema, or whose
    `$ref` leads nowhere (or outside it: nothing is fetched) is a 400, before anything runs."""

    def __init__(self, tools: list[dict[str, Any]], strict: dict[str, bool]):
        self.checks: dict[str, Any] = {}
        names = [t["function"]["name"] for t in tools]
        for tool in tools:
            fn = tool["function"]
            explicit = strict.get(fn["name"])
            if explicit is None:
                continue
            if names.count(fn["name"]) > 1:
                raise BadRequest(f"two tools are named {fn['name']!r}; give each function its "
                                 "own name", param="tools")
            what = f"function {fn['name']!r} parameters"
            # strict by default only (Responses): a schema that cannot be checked is not
            try:
                schema = strict_schema(fn.get("parameters") or {"type": "object"}, what,
                                       "tools", require_all=False)
                _check_schema(schema, what)
            except RecursionError:  # the metaschema's own recursion, on a deep schema
                if explicit:
                    raise BadRequest(f"{what}: nested too deeply to check; flatten it",
                                     param="tools") from None
                continue
            except BadRequest:
                if explicit:
                    raise
                continue
            self.checks[fn["name"]] = _Checker(schema, registry=Registry())

    def error(self, name: str, arguments: str) -> str | None:
        """Why this call's arguments break its function's schema, or None (also for a function
        that is not checked)."""
        check = self.checks.get(name)
        if check is None:
            return None
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return "the arguments are not valid JSON"
        if too_deep(value, MAX_SCHEMA_DEPTH):
            return (f"the arguments nest more than {MAX_SCHEMA_DEPTH} levels of objects and "
                    "arrays, too deeply to check")
        try:
            err = next(iter(check.iter_errors(value)), None)
        except RecursionError:
            return ("the arguments could not be checked: the schema or the arguments recurse "
                    "too deeply")
        except Exception:  # noqa: BLE001  a bug here must not lose a sampled turn
            log.warning("strict check of %r failed; the call is passed on", name, exc_info=True)
            return None
        if err is None:
            return None
        where = "/".join(str(p) for p in err.absolute_path) or "the arguments"
        return f"{where}: {err.message[:300]}"


def _check_schema(schema: dict[str, Any], what: str) -> None:
    """400 unless `schema` is valid JSON Schema whose every `$ref` points inside it."""
    err = next(iter(_META.iter_errors(schema)), None)
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path) or "the root"
        raise BadRequest(f"{what}: not a valid JSON Schema at {where}: {err.message[:200]}",
                         param="tools")
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and _pointer(schema, ref) is None:
                why = ("points to nothing in the schema" if ref == "#" or ref.startswith("#/")
                       else "is an anchor; refer by JSON pointer ('#/$defs/...')")
                raise BadRequest(f"{what}: $ref {ref[:80]!r} {why}", param="tools")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


_INDEX = re.compile(r"[0-9]{1,9}")  # an array index of a $ref pointer: ASCII, int() cheap


def _pointer(root: Any, ref: str) -> Any:
    """What the local reference `#/a/b` (or `#`) names in `root`, or None (an anchor, `#name`,
    is not looked up: strict schemas refer by pointer)."""
    if ref != "#" and not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and _INDEX.fullmatch(part) and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


_CHECKS: dict[tuple[bytes, frozenset[tuple[str, bool]]], tuple[StrictArguments, int]] = {}
_CACHE_BYTES = 16 << 20  # tools JSON kept behind the cached checks, in all
_cached_bytes = 0


def strict_arguments(tools: list[dict[str, Any]] | None, strict: dict[str, bool],
                     tools_key: bytes) -> StrictArguments | None:
    """The checks for `strict` (function name → whether the request said `strict: true`
    itself, rather than by a default) of `tools` (hashed as `tools_key`), built once per
    tool list (an agent sends the same tools every turn); None when no declared function is
    strict."""
    global _cached_bytes
    if not strict or not tools:
        return None
    key = (tools_key, frozenset(strict.items()))
    hit = _CHECKS.get(key)
    if hit is not None:
        return hit[0]
    check = StrictArguments(tools, strict)
    size = len(orjson.dumps(tools))
    if size <= _CACHE_BYTES:
        while _CHECKS and _cached_bytes + size > _CACHE_BYTES:
            _cached_bytes -= _CHECKS.pop(next(iter(_CHECKS)))[1]
        _CHECKS[key] = (check, size)
        _cached_bytes += size
    return check


def strict_names(tools: list[dict[str, Any]] | None) -> dict[str, bool]:
    """The functions of an OpenAI-shaped tool list that say `strict: true` (the Responses API,
    strict by default, says which of its tools to check itself: responses_api._checked)."""
    return {t["function"]["name"]: True for t in tools or []
            if t.get("function", {}).get("strict") is True}
