"""The `openai` backend: hosted models through LiteLLM, text in / text out (evaluation).

Hosted APIs take chat messages and return text, not token ids, so turns are recorded as text
(`GenerateResult.text`, no ids, no logprobs) and marked not trainable: evaluation runs share
the same sessions, trajectories and rewards as training runs. Messages come from the request
when the gateway passes them (`request.messages` / `request.tools`); otherwise they are
recovered from the rendered prompt ids for ChatML templates (`<|im_start|>role ... <|im_end|>`),
and anything else is sent as one user message. Tool calls the model returns come back as
Hermes `<tool_call>` text, which the gateway's tool parser reads.

Needs the `litellm` extra. `api_base` points LiteLLM at any OpenAI-compatible server (the
tests use gateway/fakes/openai_chat.py on loopback); no retries here (the router owns them).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, ClassVar

import httpx
import orjson

from envhub.gateway.backends.base import GenerateRequest, GenerateResult, WeightsNotLoadable
from envhub.gateway.errors import BackendUnavailable, BadRequest, MissingExtra, Overloaded

if TYPE_CHECKING:
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.fleet.upstreams import UpstreamSpec

_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\n?|$)", re.DOTALL)
FINISH = {"stop": "stop", "length": "length", "tool_calls": "stop", "function_call": "stop",
          "content_filter": "stop"}


def _import_litellm() -> Any:
    # LiteLLM fetches its model-price map from the internet at import unless told not to.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError as exc:
        raise MissingExtra("the openai (hosted model) backend", "litellm") from exc
    litellm.telemetry = False
    return litellm


def messages_from_chatml(text: str) -> list[dict[str, Any]]:
    """Chat messages from a rendered ChatML prompt; the trailing empty assistant header (the
    generation prompt) is dropped. Text without ChatML markers becomes one user message."""
    found = [{"role": role, "content": body} for role, body in _CHATML.findall(text)]
    if not found:
        return [{"role": "user", "content": text}]
    if found[-1]["role"] == "assistant" and not found[-1]["content"].strip():
        found.pop()
    return found


def tool_calls_as_text(calls: list[Any]) -> str:
    """OpenAI tool calls -> Hermes text the gateway's parser understands."""
    parts = []
    for call in calls:
        fn = call["function"] if isinstance(call, dict) else call.function
        name = fn["name"] if isinstance(fn, dict) else fn.name
        raw = fn["arguments"] if isinstance(fn, dict) else fn.arguments
        try:
            args = orjson.loads(raw) if isinstance(raw, str) else raw
        except orjson.JSONDecodeError:
            args = raw  # kept as a string: the parser flags it as malformed
        parts.append("<tool_call>\n" + orjson.dumps({"name": name, "arguments": args}).decode()
                     + "\n</tool_call>")
    return "\n".join(parts)


class LiteLLMBackend:
    name = "openai"
    remote: ClassVar[bool] = True
    text_only: ClassVar[bool] = True

    def __init__(self, api_base: str, *, model: str | None, api_key: str | None = None,
                 timeout: float = 600.0, instance: str | None = None,
                 tokenizer: str | None = None, weight_version: int = 0):
        if not model:
            raise ValueError("the openai backend needs a model name: set --model-name (or "
                             "`model` in the fleet config), e.g. gpt-4o-mini")
        self._litellm = _import_litellm()
        self.api_base = api_base.rstrip("/")
        self.model = model if "/" in model else f"openai/{model}"
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "none"
        self.timeout = timeout
        self.instance = instance or self.api_base
        self.weight_version = weight_version  # hosted weights never change under us
        self._tokenizer_path = tokenizer
        self._tokenizer: Any = None

    @classmethod
    def from_config(cls, config: GatewayConfig, upstream: UpstreamSpec | None
                    ) -> LiteLLMBackend:
        """One hosted endpoint: the upstream's URL and key; the model from the upstream or
        --model-name; the gateway's tokenizer to recover messages from ids."""
        if upstream is None:
            raise ValueError("the openai backend needs an upstream URL (--upstream)")
        return cls(upstream.url, model=upstream.model or config.model_name,
                   api_key=upstream.api_key(), timeout=config.upstream_timeout,
                   instance=upstream.instance_name(), tokenizer=str(config.tokenizer_path()))

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        messages = request.messages or self._messages(request.prompt_ids)
        p = request.params
        kwargs: dict[str, Any] = {
            "model": self.model, "messages": messages, "api_base": self.api_base,
            "api_key": self.api_key, "max_tokens": p.max_tokens, "temperature": p.temperature,
            "top_p": p.top_p, "timeout": self.timeout, "num_retries": 0}
        if p.stop:
            kwargs["stop"] = p.stop
        if p.seed is not None:
            kwargs["seed"] = p.seed
        if request.tools:
            kwargs["tools"] = request.tools
        if p.constraint is not None:  # a hosted model takes the request's own fields
            kwargs.update(p.constraint.request)
        try:
            response = await self._litellm.acompletion(**kwargs)
        except Exception as exc:
            raise self._error(exc) from exc
        choice = response.choices[0]
        text = choice.message.content or ""
        if getattr(choice.message, "tool_calls", None):
            text = (text + "\n" if text else "") + tool_calls_as_text(choice.message.tool_calls)
        return GenerateResult(completion_ids=[], logprobs=[],
                              finish_reason=FINISH.get(choice.finish_reason or "stop", "stop"),
                              weight_version=self.weight_version, instance=self.instance,
                              text=text, trainable=False)

    async def health(self) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {self.api_key}"}
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                r = await http.get(f"{self.api_base}/models", headers=headers)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"{self.instance} unreachable: {exc!r}") from exc
        if r.status_code >= 500:
            raise BackendUnavailable(f"{self.instance} /models answered {r.status_code}")
        return {"backend": self.name, "instance": self.instance, "status": "ok",
                "weight_version": self.weight_version}

    async def load_weights(self, path: str, version: int | None = None) -> int:
        raise WeightsNotLoadable(f"{self.instance} is a hosted model: it has no weights to "
                                 "load")

    async def aclose(self) -> None:
        pass

    def _messages(self, prompt_ids: list[int]) -> list[dict[str, Any]]:
        if self._tokenizer is None:
            if self._tokenizer_path is None:
                raise BadRequest("the openai backend got token ids but no messages and has no "
                                 "tokenizer to decode them; pass GatewayConfig.tokenizer")
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_path)
        text = self._tokenizer.decode(prompt_ids, skip_special_tokens=False)
        return messages_from_chatml(text)

    def _error(self, exc: Exception) -> Exception:
        status = getattr(exc, "status_code", None)
        message = f"{self.instance}: {type(exc).__name__}: {exc}"
        if status == 429 or type(exc).__name__ == "RateLimitError":
            return Overloaded(message, retry_after=1.0)
        if isinstance(status, int) and 400 <= status < 500 and status != 408:
            return BadRequest(message)
        return BackendUnavailable(message)
