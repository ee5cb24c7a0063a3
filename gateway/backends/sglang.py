"""The `sglang` backend: one SGLang server through its native token API.

    POST /generate {rid, input_ids, sampling_params: {max_new_tokens, temperature, top_p, stop,
                    stop_token_ids, skip_special_tokens: false, no_stop_trim: true,
                    spaces_between_special_tokens: false}, return_logprob: true}
    -> {text, meta_info: {id, finish_reason: {type, ...}, weight_version,
                          output_token_logprobs: [[logprob, token_id, text|null], ...], ...}}

Sampled ids are `[x[1] for x in output_token_logprobs]` (SGLang's OpenAI endpoints return no
ids). When the caller is cancelled (the agent hung up) the request is aborted with
`POST /abort_request {rid}` so the engine frees its KV cache. Weights: SGLang's
`POST /update_weights_from_disk {model_path, weight_version}`. Versions: SGLang reports
`weight_version` as a string ("default" until an update names one); a number is taken as the
version, anything else keeps the version this client last set. No retries here (the router
owns retries); failures map like the vllm backend's.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any, ClassVar

import httpx
import orjson

from envhub.gateway.backends.base import GenerateRequest, GenerateResult
from envhub.gateway.backends.vllm import _error
from envhub.gateway.errors import BackendUnavailable, BadRequest, Overloaded

if TYPE_CHECKING:
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.fleet.upstreams import UpstreamSpec

FINISH = {"stop": "stop", "length": "length"}  # SGLang's finish_reason.type -> OpenAI's


class SGLangBackend:
    name = "sglang"
    remote: ClassVar[bool] = True
    text_only: ClassVar[bool] = False

    def __init__(self, base_url: str, *, model: str | None = None, api_key: str | None = None,
                 timeout: float = 600.0, max_connections: int = 256, weight_version: int = 0,
                 instance: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.weight_version = weight_version
        self.instance = instance or self.base_url
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections))
        self._aborts: set[asyncio.Task[Any]] = set()  # keep fire-and-forget aborts alive

    @classmethod
    def from_config(cls, config: GatewayConfig, upstream: UpstreamSpec | None) -> SGLangBackend:
        """One instance of a fleet: the upstream's URL, model, key and name."""
        if upstream is None:
            raise ValueError("the sglang backend needs an upstream URL (--upstream)")
        return cls(upstream.url, model=upstream.model, api_key=upstream.api_key(),
                   timeout=config.upstream_timeout, instance=upstream.instance_name())

    def request_body(self, request: GenerateRequest, rid: str) -> dict[str, Any]:
        p = request.params
        sampling: dict[str, Any] = {
            "max_new_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p,
            "skip_special_tokens": False, "no_stop_trim": True,
            "spaces_between_special_tokens": False,
        }
        if p.stop:
            sampling["stop"] = p.stop
        if p.stop_token_ids:
            sampling["stop_token_ids"] = p.stop_token_ids
        if p.seed is not None:
            sampling["sampling_seed"] = p.seed
        if p.constraint is not None:
            if p.constraint.json_schema is None:
                raise BadRequest("the sglang backend cannot force tool calls (SGLang takes JSON "
                                 "schemas and EBNF, not this gateway's Lark tool-call grammar); "
                                 "use tool_choice 'auto'", param="tool_choice")
            sampling["json_schema"] = orjson.dumps(p.constraint.json_schema).decode()
        body: dict[str, Any] = {"rid": rid, "input_ids": request.prompt_ids,
                                "sampling_params": sampling, "return_logprob": True,
                                "stream": False}
        if p.top_logprobs > 0:
            body["top_logprobs_num"] = p.top_logprobs
        return body

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        # A fresh rid per attempt: a retry on the same server must not collide with an
        # aborted twin that is still being cleaned up.
        rid = f"{request.request_id or 'req'}-{uuid.uuid4().hex[:8]}"
        try:
            status, data = await self._call("POST", "/generate", self.request_body(request, rid))
        except asyncio.CancelledError:
            self._abort_later(rid)
            raise
        if status != 200:
            raise _error(status, data, self.instance)
        return self.parse(data)

    def parse(self, data: Any) -> GenerateResult:
        """A non-streaming /generate answer (one prompt) -> GenerateResult."""
        try:
            if isinstance(data, list):  # a batch of one
                data = data[0]
            meta = data["meta_info"]
            rows = meta["output_token_logprobs"]
            finish = meta.get("finish_reason") or {}
            kind = finish.get("type") if isinstance(finish, dict) else str(finish)
            if kind == "abort":
                raise BackendUnavailable(f"{self.instance} aborted the request: "
                                         f"{finish.get('message', 'no reason given')}")
            tops = meta.get("output_top_logprobs")
            return GenerateResult(
                completion_ids=[int(x[1]) for x in rows],
                logprobs=[float(x[0]) for x in rows],
                finish_reason=FINISH.get(kind or "stop", "stop"),
                weight_version=self._version(meta.get("weight_version")),
                instance=self.instance,
                top_logprobs=None if not tops else [
                    sorted(((int(x[1]), float(x[0])) for x in (row or [])), key=lambda v: -v[1])
                    for row in tops])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"{self.instance} answered an unexpected /generate shape "
                                     f"({exc!r}); is it an SGLang server?") from exc

    async def abort(self, rid: str) -> None:
        """Tell the server to drop a request (frees its KV cache); errors are ignored: the
        request may have finished already."""
        try:
            await self._client.post("/abort_request", content=orjson.dumps({"rid": rid}),
                                    timeout=5)
        except httpx.HTTPError:
            pass

    def _abort_later(self, rid: str) -> None:
        task = asyncio.get_running_loop().create_task(self.abort(rid))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def load_weights(self, path: str, version: int | None = None) -> int:
        target = version if version is not None else self.weight_version + 1
        status, data = await self._call("POST", "/update_weights_from_disk",
                                        {"model_path": path, "weight_version": str(target)})
        if status != 200 or (isinstance(data, dict) and data.get("success") is False):
            message = data.get("message") if isinstance(data, dict) else None
            raise _error(status if status != 200 else 400,
                         {"message": message or str(data)[:500]}, self.instance)
        self.weight_version = target
        return target

    async def health(self) -> dict[str, Any]:
        status, _ = await self._call("GET", "/health", None)
        if status != 200:
            raise BackendUnavailable(f"{self.instance} /health answered {status}")
        status, info = await self._call("GET", "/model_info", None)
        if status == 404:  # SGLang before /model_info
            status, info = await self._call("GET", "/get_model_info", None)
        version = self._version(info.get("weight_version") if isinstance(info, dict) else None)
        return {"backend": self.name, "instance": self.instance, "status": "ok",
                "weight_version": version}

    async def aclose(self) -> None:
        if self._aborts:
            await asyncio.gather(*self._aborts, return_exceptions=True)
        await self._client.aclose()

    def _version(self, raw: Any) -> int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
            return int(raw)
        return self.weight_version

    async def _call(self, method: str, path: str, body: dict[str, Any] | None
                    ) -> tuple[int, Any]:
        try:
            response = await self._client.request(
                method, path, content=None if body is None else orjson.dumps(body))
        except httpx.TimeoutException as exc:
            raise BackendUnavailable(f"{self.instance}: timed out ({exc!r})") from exc
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"{self.instance} unreachable: {exc!r}") from exc
        try:
            data = orjson.loads(response.content) if response.content else {}
        except orjson.JSONDecodeError:
            data = {"raw": response.text[:500]}
        if response.status_code == 429:
            raise Overloaded(f"{self.instance} is overloaded",
                             retry_after=float(response.headers.get("retry-after", 1)))
        return response.status_code, data
