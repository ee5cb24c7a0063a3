"""The `vllm` backend: one engine instance behind vLLM's token-in `/v1/completions`.

Works with a real vLLM (>= 0.10.2 for `return_token_ids`) and with `envhub engine`. One pooled
async HTTP client per backend: aiohttp when installed (measured against httpx on the zero
engine: ~3x less client CPU per sequential call, ~12x at 32 concurrent calls), else httpx.
No retries here: the router owns retry policy, and a retrying client under it would multiply
attempts. Failures map onto gateway errors the router can act on: connection problems and 5xx
-> BackendUnavailable (retry elsewhere), 429 -> Overloaded, 400/413/422 -> BadRequest (the
request itself is wrong; do not retry).

Grouped speculative decoding: `envhub engine --speculative group` drafts from a request's RL
group, so requests carry `group_id` — but only once the engine has shown it is envhub's (its
choices carry `forwards`), as vLLM logs a warning for each unknown field. vLLM has no notion
of groups: its model-free speculation is a server launch option, `vllm serve MODEL
--speculative-config '{"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_max": 4}'` (drafts from the request's own prompt and output) or
'{"method": "suffix", ...}' (Arctic Inference's suffix trees: the request's own tokens plus a
global tree over all finished requests, groups unknown). The gateway does not launch vLLM, so
that flag goes on the user's `vllm serve` command line; both keep the target distribution.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import orjson

from envhub.gateway.backends.base import GenerateRequest, GenerateResult
from envhub.gateway.errors import BackendUnavailable, BadRequest, GatewayError, Overloaded

if TYPE_CHECKING:
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.fleet.upstreams import UpstreamSpec

TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids labels


class VLLMBackend:
    """HTTP client of one vLLM-shaped engine. `weight_version` is taken from each response's
    `weight_version` field when the engine sends one (envhub engine does; vLLM 0.32's
    /v1/completions does not, then the value set here — by `load_weights`, or by whoever
    pushed the weights — is stamped)."""

    name = "vllm"
    remote: ClassVar[bool] = True
    text_only: ClassVar[bool] = False

    def __init__(self, base_url: str, *, model: str | None = None, api_key: str | None = None,
                 timeout: float = 600.0, max_connections: int = 256, weight_version: int = 0,
                 instance: str | None = None, client: str = "auto"):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.weight_version = weight_version
        self.instance = instance or self.base_url
        self._weight_info = True  # the engine may serve GET /weight_info (vLLM dev mode)
        self._envhub_engine = False  # learnt from responses: send envhub's fields (group_id)
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._transport = make_transport(client, self.base_url, headers, timeout,
                                         max_connections)

    @classmethod
    def from_config(cls, config: GatewayConfig, upstream: UpstreamSpec | None) -> VLLMBackend:
        """One instance of a fleet: the upstream's URL, model, key and name."""
        if upstream is None:
            raise ValueError("the vllm backend needs an upstream URL (--upstream)")
        return cls(upstream.url, model=upstream.model, api_key=upstream.api_key(),
                   timeout=config.upstream_timeout, instance=upstream.instance_name())

    def request_body(self, request: GenerateRequest) -> dict[str, Any]:
        p = request.params
        body: dict[str, Any] = {
            "prompt": request.prompt_ids, "max_tokens": p.max_tokens,
            "temperature": p.temperature, "top_p": p.top_p, "n": 1,
            # logprobs=k returns the sampled token's logprob plus k alternatives.
            "logprobs": p.top_logprobs, "return_token_ids": True,
            "return_tokens_as_token_ids": True, "add_special_tokens": False,
            "skip_special_tokens": False, "include_stop_str_in_output": True,
        }
        if self.model:
            body["model"] = self.model
        if p.stop:
            body["stop"] = p.stop
        if p.stop_token_ids:
            body["stop_token_ids"] = p.stop_token_ids
        if p.seed is not None:
            body["seed"] = p.seed
        if p.constraint is not None:  # vLLM's structured outputs (grammar: Lark, llguidance)
            body["structured_outputs"] = p.constraint.vllm()
        if request.request_id:
            body["request_id"] = request.request_id
        if request.group_id and self._envhub_engine:
            body["group_id"] = request.group_id
        return body

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        status, data = await self._call("POST", "/v1/completions", self.request_body(request))
        if status != 200:
            raise _error(status, data, self.instance)
        return self.parse(data)

    def parse(self, data: dict[str, Any]) -> GenerateResult:
        """A completions response (one choice) -> GenerateResult."""
        try:
            choice = data["choices"][0]
            logprobs = choice.get("logprobs") or {}
            ids = choice.get("token_ids")
            if ids is None:  # vLLM < 0.10.2: recover ids from the token_id:N labels
                ids = [_label_id(s) for s in logprobs["tokens"]]
            lps = logprobs.get("token_logprobs")
            if lps is None or len(lps) != len(ids):
                raise BackendUnavailable(f"{self.instance} returned no logprobs per token; "
                                         "it must honour logprobs=0")
            tops = logprobs.get("top_logprobs")
            forwards = choice.get("forwards")
            self._envhub_engine = self._envhub_engine or "forwards" in choice
            return GenerateResult(
                completion_ids=list(ids), logprobs=[float(x) for x in lps],
                finish_reason=choice.get("finish_reason") or "stop",
                weight_version=int(data.get("weight_version", self.weight_version)),
                instance=self.instance, prompt_ids_seen=choice.get("prompt_token_ids"),
                forwards=forwards if isinstance(forwards, int) else None,
                top_logprobs=None if not tops else [
                    sorted(((_label_id(k), float(v)) for k, v in (row or {}).items()),
                           key=lambda kv: -kv[1]) for row in tops])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"{self.instance} answered an unexpected completions "
                                     f"shape ({exc!r}); is it a vLLM-compatible server?") from exc

    async def load_weights(self, path: str, version: int | None = None) -> int:
        """vLLM's own RL routes (vLLM >= 0.32 with VLLM_SERVER_DEV_MODE=1; envhub engine
        serves the same): `/pause?mode=wait` (running requests finish, new ones queue),
        `/collective_rpc` reload_weights from the folder, `/update_weight_version`, and
        `/resume` in every case, so a failed load never leaves the engine paused."""
        target = version if version is not None else self.weight_version + 1
        await self._rl("POST", "/pause?mode=wait", None)
        try:
            await self._rl("POST", "/collective_rpc", {
                "method": "reload_weights", "kwargs": {"weights_path": path}})
            await self._rl("POST", "/update_weight_version", {"new_version": str(target)})
        finally:
            await self._rl("POST", "/resume", None)
        self.weight_version = target
        return target

    async def _rl(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        status, data = await self._call(method, path, body)
        if status == 404:
            raise BackendUnavailable(
                f"engine {self.instance} has no {path.split('?')[0]} route: start vLLM with "
                "VLLM_SERVER_DEV_MODE=1 (its RL endpoints) to load weights through the gateway")
        if status != 200:
            raise _error(status, data, self.instance)
        return data

    async def health(self) -> dict[str, Any]:
        """`weight_version`: the engine's when it says, else the one stamped here;
        `engine_weight_version`: only what the engine itself reports (vLLM's /health is an
        empty 200, so its RL route `/weight_info` is asked; None when it has none). The
        heartbeat compares the latter with the fleet's: a restarted engine reports its
        start-up version while this client still holds the last one pushed."""
        status, data = await self._call("GET", "/health", None)
        if status != 200:
            raise BackendUnavailable(f"{self.instance} /health answered {status}")
        said = data.get("weight_version") if isinstance(data, dict) else None
        reported = said
        if reported is None and self._weight_info:
            status, info = await self._call("GET", "/weight_info", None)
            self._weight_info = status != 404  # vLLM without dev mode: do not ask again
            reported = info.get("weight_version") if status == 200 and isinstance(info, dict) \
                else None
        return {"backend": self.name, "instance": self.instance, "status": "ok",
                "weight_version": self.weight_version if said is None else said,
                "engine_weight_version": reported}

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None
                    ) -> tuple[int, Any]:
        try:
            status, headers, content = await self._transport.request(
                method, path, None if body is None else orjson.dumps(body))
        except TransportTimeout as exc:
            raise BackendUnavailable(f"{self.instance}: timed out ({exc})") from exc
        except TransportError as exc:
            raise BackendUnavailable(f"{self.instance} unreachable: {exc}") from exc
        try:
            data = orjson.loads(content) if content else {}
        except orjson.JSONDecodeError:
            data = {"raw": content[:500].decode(errors="replace")}
        if status == 429:
            raise Overloaded(f"{self.instance} is overloaded",
                             retry_after=float(headers.get("retry-after", 1)))
        return status, data


def _label_id(label: str) -> int:
    if not label.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"expected a '{TOKEN_ID_PREFIX}N' label, got {label!r}")
    return int(label[len(TOKEN_ID_PREFIX):])


def _error(status: int, data: Any, instance: str) -> GatewayError:
    err = data.get("error") if isinstance(data, dict) else None
    message = (err.get("message") if isinstance(err, dict) else None) or \
        (data.get("message") if isinstance(data, dict) else None) or str(data)[:500]
    if status in (400, 413, 422):  # the request itself is wrong: retrying cannot help
        return BadRequest(f"the engine rejected the request: {message}",
                          param=err.get("param") if isinstance(err, dict) else None)
    # 404/405: not a vLLM-shaped endpoint; 401/403: engine credentials; 5xx: engine failure.
    return BackendUnavailable(f"engine {instance} failed with HTTP {status}: {message}")


# -- transports: one pooled client, aiohttp or httpx -----------------------------------------


class TransportError(Exception):
    """The engine could not be reached (connection refused, reset, DNS, ...)."""


class TransportTimeout(TransportError):
    pass


class Transport(Protocol):
    async def request(self, method: str, path: str, body: bytes | None
                      ) -> tuple[int, Mapping[str, str], bytes]: ...

    async def aclose(self) -> None: ...


class AiohttpTransport:
    """aiohttp session created lazily inside the running loop (sessions are loop-bound)."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float,
                 max_connections: int):
        import aiohttp

        self._aiohttp = aiohttp
        self._base_url, self._headers = base_url, headers
        self._timeout = aiohttp.ClientTimeout(total=timeout, connect=10)
        self._limit = max_connections
        self._session: Any = None

    async def request(self, method: str, path: str, body: bytes | None
                      ) -> tuple[int, Mapping[str, str], bytes]:
        aiohttp = self._aiohttp
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._limit))
        try:
            async with self._session.request(method, self._base_url + path, data=body) as r:
                return r.status, r.headers, await r.read()
        except TimeoutError as exc:
            raise TransportTimeout(repr(exc)) from exc
        except aiohttp.ClientError as exc:
            raise TransportError(repr(exc)) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class HttpxTransport:
    def __init__(self, base_url: str, headers: dict[str, str], timeout: float,
                 max_connections: int):
        import httpx

        self._httpx = httpx
        self._client = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections))

    async def request(self, method: str, path: str, body: bytes | None
                      ) -> tuple[int, Mapping[str, str], bytes]:
        try:
            r = await self._client.request(method, path, content=body)
        except self._httpx.TimeoutException as exc:
            raise TransportTimeout(repr(exc)) from exc
        except self._httpx.HTTPError as exc:
            raise TransportError(repr(exc)) from exc
        return r.status_code, r.headers, r.content

    async def aclose(self) -> None:
        await self._client.aclose()


def make_transport(client: str, base_url: str, headers: dict[str, str], timeout: float,
                   max_connections: int) -> Transport:
    """`client`: "aiohttp", "httpx", or "auto" (aiohttp when installed)."""
    if client == "auto":
        try:
            import aiohttp  # noqa: F401
            client = "aiohttp"
        except ImportError:
            client = "httpx"
    if client == "aiohttp":
        return AiohttpTransport(base_url, headers, timeout, max_connections)
    if client == "httpx":
        return HttpxTransport(base_url, headers, timeout, max_connections)
    raise ValueError(f"unknown HTTP client {client!r}: use auto, aiohttp or httpx")
