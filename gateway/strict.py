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
"""

from __future__ import annotations

from typing import Any

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
