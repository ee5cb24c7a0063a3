"""Structured outputs: `response_format` and forced tool calls, as a constraint on sampling.

OpenAI's `response_format` (`json_object`, `json_schema`) and `tool_choice` (`required`, a named
function) and `parallel_tool_calls: false`, and Anthropic's `tool_choice` (`any`, `tool`), are
turned into one `Constraint`:

- `json_schema`: the completion must be a JSON value matching this schema (`json_object` is
  `{"type": "object"}`);
- `grammar`: a Lark grammar in llguidance's dialect, for forced tool calls in the model
  family's own tool-call syntax (only the Hermes/Qwen `<tool_call>` format is written here;
  other formats get a 400 that says so).

`strict: true` on a json_schema or a function tool first gives the schema strict mode's meaning
(gateway/strict.py: objects closed, every property required; 400 for what strict mode does not
support). Tool calls under tool_choice 'auto' are parsed, not constrained, so a strict
function's schema binds forced calls only.

Token engines constrain decoding with it: the embedded engine through llguidance (a token mask
per step, gateway/engine/guide.py), vLLM through its `structured_outputs` request field, SGLang
through `json_schema` (it has no Lark grammar: forced tool calls are refused there). A hosted
model (litellm) gets the request's own `response_format` / `tool_choice`. A backend that
cannot constrain answers 400, never silently ignores the request.

Logprobs: the engine samples from the masked, renormalised distribution, and that is what it
reports (`log_softmax` over the allowed tokens only). For training this means the grammar is
part of the behaviour policy: a trainer that recomputes `log_softmax` over the whole vocabulary
sees ratios `p(token) / p_masked(token) = Z <= 1` (Z, the probability mass the model put on the
allowed tokens), which the two-sided IS mask may cut where the model fought the grammar. Train
constrained turns with the same mask, or leave them out (`trainable` stays true: the choice is
the trainer's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from envhub.gateway.errors import BadRequest
from envhub.gateway.strict import strict_schema

# Lark terminals for a Hermes tool call; the tag tokens are referenced by id when the tokenizer
# has them as single tokens (Qwen: 151657/151658), else matched as text.
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_WS = {"whitespace_flexible": False}  # one canonical layout: no runaway whitespace


@dataclass(frozen=True)
class Constraint:
    """What a completion must match. Exactly one of `json_schema` / `grammar` is set."""

    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    # the request's own fields, for engines that take them as they are (hosted models)
    request: dict[str, Any] = field(default_factory=dict, compare=False)

    def vllm(self) -> dict[str, Any]:
        """vLLM's `structured_outputs` request field (vLLM >= 0.10.2; checked on 0.32). vLLM's
        auto backend hands the Lark grammar (llguidance's dialect) to its guidance backend
        once xgrammar refuses it. JSON whitespace is vLLM's server setting, not a request
        field: run it with `--structured-outputs-config '{"backend": "guidance",
        "disable_any_whitespace": true}'`, or a weak model may spend max_tokens on blanks."""
        if self.grammar is not None:
            return {"grammar": self.grammar}
        return {"json": self.json_schema}

    def lark(self) -> str:
        """The whole constraint as one Lark grammar (what llguidance compiles)."""
        if self.grammar is not None:
            return self.grammar
        return "start: " + _json(self.json_schema or {}) + "\n"


def _json(schema: dict[str, Any]) -> str:
    return "%json " + orjson.dumps({**schema, "x-guidance": _WS}).decode()


def response_format(raw: Any) -> dict[str, Any] | None:
    """The JSON schema `response_format` asks for, or None for free text (400 when malformed)."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise BadRequest("response_format json_schema needs 'json_schema': {'name': ..., "
                             "'schema': {...}}", param="response_format.json_schema")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be a JSON Schema object",
                             param="response_format.json_schema.schema")
        if spec.get("strict") is True:
            return strict_schema(schema, "response_format's schema",
                                 "response_format.json_schema.schema")
        return schema
    raise BadRequest("'response_format' must be {'type': 'text'}, {'type': 'json_object'} or "
                     "{'type': 'json_schema', 'json_schema': {...}}", param="response_format")


def tool_call_grammar(tools: list[dict[str, Any]], names: list[str] | None, *,
                      text_first: bool, many: bool, tool_format: str,
                      tag_ids: tuple[int | None, int | None],
                      answer: dict[str, Any] | None = None) -> str:
    """A Lark grammar for tool calls to `names` (default: every tool) in the model's syntax.

    text_first: free text may come first and the call is optional (tool_choice 'auto' with
    parallel_tool_calls false: at most one call); otherwise at least one call, nothing else.
    many: further calls may follow (parallel tool calls). answer: instead of free text, the
    answer is JSON matching this schema — or the calls (response_format with tools under
    'auto': the format binds the answer, not the turns that call tools)."""
    if tool_format != "hermes":
        raise BadRequest(f"forcing tool calls is not supported for this model's tool-call "
                         f"format ({tool_format!r}); use tool_choice 'auto'",
                         param="tool_choice")
    chosen = [t["function"] for t in tools if names is None or t["function"]["name"] in names]
    schema = {"anyOf": [{
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, "arguments": _arguments(fn)},
        "required": ["name", "arguments"], "additionalProperties": False} for fn in chosen]}
    open_, close = (f"<[{i}]>" if i is not None else orjson.dumps(s).decode()
                    for i, s in zip(tag_ids, (_OPEN, _CLOSE), strict=True))
    rules = [f'call: {open_} "\\n" {_json(schema)} "\\n" {close}']
    calls = 'call ("\\n" call)*' if many else "call"
    if answer is not None:
        rules.insert(0, f"start: answer | {calls}\nanswer: {_json(answer)}")
    elif text_first:
        rules.insert(0, "start: TEXT call?\nTEXT: /(?s:.*)/")
    else:
        rules.insert(0, f"start: {calls}")
    return "\n".join(rules) + "\n"


def _arguments(fn: dict[str, Any]) -> dict[str, Any]:
    """The schema a call's arguments must match: the function's parameters, with strict mode's
    meaning (gateway/strict.py) when the function says `strict: true`."""
    params = fn.get("parameters") or {"type": "object"}
    if fn.get("strict") is True:
        return strict_schema(params, f"function {fn['name']!r} parameters", "tools")
    return params


def check(constraint: Constraint) -> None:
    """400 for a schema or grammar that cannot be compiled (before any engine sees it)."""
    try:
        import llguidance
    except ImportError:  # engines that compile remotely still validate there
        return
    ok, error = _validate(llguidance, constraint.lark())
    if not ok:
        raise BadRequest(f"the structured-output constraint cannot be compiled: {error}",
                         param="response_format" if constraint.json_schema is not None
                         else "tool_choice")


def _validate(llguidance: Any, lark: str) -> tuple[bool, str]:
    try:
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    except Exception as e:  # defensive: the compiler reports, it should not raise
        return False, str(e)
    return not is_error, "; ".join(messages)


def _tag_ids(tokenizer: Any) -> tuple[int | None, int | None]:
    """The ids of `<tool_call>` / `</tool_call>` when each is one token of the vocabulary."""
    out: list[int | None] = []
    for tag in (_OPEN, _CLOSE):
        tid = tokenizer.convert_tokens_to_ids(tag)
        out.append(tid if isinstance(tid, int) and tokenizer.decode([tid]) == tag else None)
    return out[0], out[1]


def forced_call(tool_choice: Any) -> tuple[str | None, str | None]:
    """(force, name) for `for_request` from the chat route's (validated) tool_choice:
    'required' → some tool call, {'type': 'function', 'function': {'name': N}} → a call to N."""
    if tool_choice == "required":
        return "required", None
    if isinstance(tool_choice, dict):
        return "named", tool_choice["function"]["name"]
    return None, None


def for_request(renderer: Any, tools: list[dict[str, Any]] | None, *, fmt: Any = None,
                force: str | None = None, name: str | None = None,
                parallel: bool = True, request: dict[str, Any] | None = None
                ) -> Constraint | None:
    """The constraint of one request, or None. `fmt`: OpenAI's response_format; `force`:
    'required' (some tool call) or 'named' (a call to `name`); `parallel`: several calls may
    follow one another. `request`: the fields a hosted model takes as they are."""
    schema = response_format(fmt)
    constraint: Constraint | None = None
    # With tools, a format binds the answer, not a turn that calls tools (OpenAI; Anthropic's
    # JSON outputs "with tool use in the same request"): under 'auto' the answer is the JSON or
    # the calls; a forced call has no answer to format. Tool formats other than Hermes have no
    # call grammar here: the format alone, as before.
    answer = schema if force is None and renderer.tool_format == "hermes" else None
    try:
        if tools and (force is not None or not parallel or answer is not None):
            grammar = tool_call_grammar(
                tools, [name] if force == "named" and name else None,
                text_first=force is None, many=parallel, tool_format=renderer.tool_format,
                tag_ids=_tag_ids(renderer.tokenizer), answer=answer)
            constraint = Constraint(grammar=grammar, request=request or {})
        elif schema is not None:
            constraint = Constraint(json_schema=schema, request=request or {})
        if constraint is not None:
            check(constraint)
    except orjson.JSONEncodeError:  # deeper than orjson writes (254 levels)
        raise BadRequest("a schema of this request nests deeper than 254 levels; flatten it",
                         param="response_format" if schema is not None else "tools") from None
    return constraint
