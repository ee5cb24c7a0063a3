"""HTTP shapes of `envhub engine`: vLLM's token-in `/v1/completions` and SGLang's weight API.

Only what envhub and vLLM-style RL clients use is modelled; unknown fields are accepted and
ignored (as vLLM does), so OpenAI clients that send extra defaults keep working.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from envhub.gateway.backends.base import SamplingParams
from envhub.gateway.errors import BadRequest
from envhub.gateway.structured import Constraint

TokenId = StrictInt  # no floats or booleans smuggled in as ids
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    seed: int | None = None
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool = False
    stream: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    add_special_tokens: bool = True
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    request_id: str | None = None
    session_id: str | None = None
    # envhub's: the RL group of the request (grouped speculative decoding drafts from it)
    group_id: str | None = None
    # vLLM's structured outputs: {"json": schema | "schema text"}, {"json_object": true} or
    # {"grammar": "<Lark, llguidance dialect>"}
    structured_outputs: dict[str, Any] | None = None

    def constraint(self) -> Constraint | None:
        so = self.structured_outputs
        if not so:
            return None
        known = {k: v for k, v in so.items() if v not in (None, False)}
        if set(known) - {"json", "json_object", "grammar"} or len(known) != 1:
            raise BadRequest("structured_outputs takes exactly one of 'json' (a JSON schema), "
                             "'json_object': true or 'grammar' (Lark) in this engine",
                             param="structured_outputs")
        if "grammar" in known:
            if not isinstance(known["grammar"], str):
                raise BadRequest("structured_outputs.grammar must be a string",
                                 param="structured_outputs.grammar")
            return Constraint(grammar=known["grammar"])
        schema = known.get("json", {"type": "object"})
        if isinstance(schema, str):
            try:
                schema = orjson.loads(schema)
            except orjson.JSONDecodeError:
                schema = None
        if not isinstance(schema, dict):
            raise BadRequest("structured_outputs.json must be a JSON Schema object",
                             param="structured_outputs.json")
        return Constraint(json_schema=schema)

    def prompts(self) -> list[list[int]] | list[str]:
        """One entry per prompt: id lists stay ids, strings stay strings (tokenized later)."""
        p = self.prompt
        if not p:
            raise BadRequest("prompt is empty: send token ids (or a list of id lists)",
                             param="prompt")
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return p  # type: ignore[return-value]

    def sampling(self, seed: int | None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_tokens if self.max_tokens is not None else 16,
            temperature=self.temperature if self.temperature is not None else 1.0,
            top_p=self.top_p if self.top_p is not None else 1.0,
            stop=stop, stop_token_ids=list(self.stop_token_ids or []), seed=seed,
            top_logprobs=self.logprobs or 0, constraint=self.constraint())


class UpdateWeightsRequest(BaseModel):
    """SGLang's `/update_weights_from_disk` body (`load_format` etc. are accepted, ignored)."""

    model_config = ConfigDict(extra="allow")

    model_path: str
    weight_version: int | str | None = None

    def version(self) -> int | None:
        v = self.weight_version
        if v is None or isinstance(v, int):
            return v
        if v.strip().lstrip("-").isdigit():
            return int(v)
        raise ValueError(f"weight_version must be an integer, got {v!r}")


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict[str, Any]:
    """OpenAI's error shape (vLLM answers in it too)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
