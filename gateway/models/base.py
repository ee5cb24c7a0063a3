"""What every request model shares: strict parsing into a 400 that names the field, the
`/openapi.json` request bodies, the documented error responses and the `x-envhub-ignored`
header.

A route reads its body with orjson (any content type, as the OpenAI and Anthropic APIs take it),
validates it with `parse(Model, body)` and declares the same model with `body_of(Model)`, so the
schema fuzzers and client generators see exactly what is checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.json_schema import models_json_schema

from envhub.gateway.errors import BadRequest

M = TypeVar("M", bound=BaseModel)
_REF = "#/components/schemas/{model}"
_DESCRIBED: dict[str, type[BaseModel]] = {}


class Body(BaseModel):
    """A strict request body: a JSON boolean is a boolean (`"stream": "false"` is refused, not
    truthy), numbers are range-checked. Unknown top-level fields are kept (`extra="allow"`)
    and named in `x-envhub-ignored`: clients send fields of their own and must keep working.

    `HINTS` (field → message) replace pydantic's wording for a top-level field (for any error
    under it, unless the field is in `DEEP`, whose nested errors name their own path);
    `REQUIRED` (field → message) is said when a required field is missing."""

    model_config = ConfigDict(strict=True, extra="allow")

    HINTS: ClassVar[dict[str, str]] = {}
    REQUIRED: ClassVar[dict[str, str]] = {}
    DEEP: ClassVar[frozenset[str]] = frozenset()
    UNUSED: ClassVar[tuple[str, ...]] = ()  # declared, accepted, not used: reported

    def ignored(self) -> list[str]:
        """Fields the client set that do not change what this gateway does."""
        names = [k for k in self.UNUSED if getattr(self, k, None) is not None]
        names += [k for k, v in (self.model_extra or {}).items() if v is not None]
        return sorted(names)


def parse(model: type[M], body: Any) -> M:
    """`body` validated as `model`; a BadRequest naming the field otherwise."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise bad_request(e.errors(), model) from None


def bad_request(errors: Sequence[Any], model: Any = None, *, located: bool = False
                ) -> BadRequest:
    """The most specific of pydantic's errors (a union reports one per alternative: the
    deepest is the one that got furthest) as a 400 naming the field. `located`: FastAPI's
    errors, whose loc starts with where the value came from (body, query, path); a model's own
    field may be called `path` too, so that prefix is only dropped then."""
    err = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = tuple(err.get("loc", ()))
    if located and loc[:1] in (("body",), ("query",), ("path",)):
        loc = loc[1:]
    kind = err.get("type", "")
    if not loc and kind in ("model_type", "model_attributes_type", "dict_type"):
        return BadRequest("the request body must be a JSON object")
    if kind == "json_invalid":
        return BadRequest("the request body is not valid JSON; send a JSON object")
    top = str(loc[0]) if loc else ""
    hints: dict[str, str] = getattr(model, "HINTS", {})
    required: dict[str, str] = getattr(model, "REQUIRED", {})
    deep: frozenset[str] = getattr(model, "DEEP", frozenset())
    if kind == "missing" and len(loc) == 1:
        msg = required.get(top) or hints.get(top) or f"'{top}' is required"
        return BadRequest(msg, param=top)
    if top in hints and (len(loc) == 1 or top not in deep):
        return BadRequest(f"{hints[top]}; got {_shown(err.get('input'))}", param=top)
    param = field_path(loc)
    if kind == "bool_type":
        return BadRequest(f"'{param}' must be a JSON boolean (true or false); got "
                          f"{_shown(err.get('input'))}", param=param or None)
    return BadRequest(f"{param or 'request'}: {err.get('msg', 'invalid value')}",
                      param=param or None)


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


_TYPE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none"}


def field_path(loc: Any) -> str:
    """('input', 'list[...]', 0, 'call_id') → 'input[0].call_id': fields and indexes, without
    the union-alternative labels pydantic puts in between ('str', 'list[...]', 'ToolChoice')."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not ("[" in part or part[:1].isupper() or part in _TYPE_LABELS
                  or part.startswith("function-")):
            out += f".{part}" if out else part
    return out


def ignored_header(names: list[str], limit: int = 32) -> str:
    """Field names for the `x-envhub-ignored` header: printable ASCII without commas (a client
    may send any key; a header value may not carry any character), at most `limit`, then a
    count of the rest."""
    safe = [n for n in names if n and n.isascii() and n.isprintable() and "," not in n]
    out = safe[:limit]
    if len(names) > len(out):
        out.append(f"(+{len(names) - len(out)} more)")
    return ",".join(out)


# -- /openapi.json ----------------------------------------------------------------------------

def body_of(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """`openapi_extra` declaring `model` as the route's JSON request body."""
    _DESCRIBED[model.__name__] = model
    return {"requestBody": {"required": required, "content": {
        "application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}}}}


def described_as(model: type[BaseModel], *, min_items: int | None = None,
                 nullable: bool = False) -> dict[str, Any]:
    """The schema of a field validated by hand but described by `model` (a list of them when
    `min_items` is given; or null when `nullable`), for `WithJsonSchema`."""
    _DESCRIBED[model.__name__] = model
    ref = {"$ref": _REF.format(model=model.__name__)}
    schema = {"type": "array", "items": ref, "minItems": min_items} if min_items is not None \
        else ref
    # (a bare top-level $ref would be resolved by pydantic, which does not know it: wrapped)
    return {"anyOf": [schema, {"type": "null"}]} if nullable else {"allOf": [schema]}


def error_responses(schema: dict[str, Any], codes: tuple[int, ...]) -> dict[int | str, Any]:
    """`responses=` for a router: the 4xx/5xx its routes answer, in its API's error shape."""
    words = {400: "invalid request (the message names the field)", 401: "missing or unknown "
             "API key", 403: "this key may not do that", 404: "no such model, session or "
             "response", 405: "wrong method (`Allow` names the right ones)", 409: "the "
             "session is closed or the id is taken", 413: "request body too large",
             429: "engines paused or saturated (`Retry-After`)", 499: "client disconnected",
             503: "no engine available"}
    return {code: {"description": words[code], "content": {"application/json": {
        "schema": schema}}} for code in codes}


_TEXT = {"type": "string"}
_OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"], "properties": {
        "message": _TEXT, "type": _TEXT, "param": {"type": ["string", "null"]},
        "code": {"type": ["string", "null"]}}}}}
_ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                          "properties": {"type": _TEXT, "message": _TEXT}}}}
_CODES = (400, 401, 403, 404, 409, 413, 429, 503)
OPENAI_ERRORS = error_responses(_OPENAI_ERROR, _CODES)
ANTHROPIC_ERRORS = error_responses(_ANTHROPIC_ERROR, _CODES)
# the completion routes answer a stream when asked to (`stream: true`)
STREAMS: dict[int | str, Any] = {200: {"description": "the answer: JSON, or server-sent "
                                       "events with `stream: true`",
                                       "content": {"text/event-stream": {}}}}


def install_openapi(app: FastAPI) -> None:
    """Add the request-body models (and the models they use) to the app's components."""
    base: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = base()
        for ops in spec.get("paths", {}).values():  # invalid input is a 400 here, never a 422
            for op in ops.values():
                op.get("responses", {}).pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            spec.get("components", {}).get("schemas", {}).pop(unused, None)
        _, top = models_json_schema([(m, "validation") for m in _DESCRIBED.values()],
                                    ref_template=_REF)
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in top.get("$defs", {}).items():
            if schemas.get(name, schema) != schema:  # two models of one name: rename one
                raise RuntimeError(f"two request models are both named {name!r}")
            schemas[name] = schema
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
