"""Every request a judge makes, in one place: the endpoint, the cache, the budget, retries.

Endpoint: `base_url` of the spec (any OpenAI-compatible server, key from `api_key_env`), or by
default the run's gateway (`use_gateway`): each call opens its own session there with metadata
`{"trainable": false, "role": "judge"}`, so the judge's turns are recorded (token ids and all)
but never trained on, and closes it after. Retries: transport errors, 429 and 5xx only, with
tenacity; every attempt counts against `max_calls`, a cached verdict does not. Past the budget,
or when the endpoint keeps failing, the error is a `JudgeError`: an infrastructure failure
(env_failure), never a reward of 0.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from envhub.envs.environment import EnvFailure
from envhub.envs.manifest import JudgeSpec
from envhub.envs.rewards.judge.cache import VerdictCache

MAX_BODY_BYTES = 1 << 20  # a judge's answer bigger than this is refused unread
MAX_CONTENT_CHARS = 64_000  # a verdict is a few numbers and a reason


class JudgeError(EnvFailure):
    """The judge could not give a verdict (endpoint down or refusing, budget spent): the group
    is excluded (env_failure), never scored 0. The message names the judge and the fix."""


class JudgeBudgetExhausted(JudgeError):
    """`max_calls` requests were made; raise it in the manifest or judge fewer outputs."""


class _Retryable(Exception):
    """A failure worth another attempt: transport error, 429, 5xx."""


class JudgeCalls:
    def __init__(self, spec: JudgeSpec, name: str) -> None:
        self.spec, self.name = spec, name
        self.cache = VerdictCache(spec.cache)
        self.spent = 0  # requests made (attempts), against spec.max_calls
        self._lock = threading.Lock()
        self._gateway: tuple[str, str | None] | None = None
        self._served: str | None = None
        self._client = httpx.Client(timeout=spec.timeout_s)

    def use_gateway(self, url: str, admin_key: str | None) -> None:
        self._gateway = (url.rstrip("/"), admin_key)

    def endpoint_id(self) -> dict[str, str]:
        """What identifies the judge in cache keys (not a run's gateway port)."""
        return {"base_url": self.spec.base_url or "gateway", "model": self.spec.model or ""}

    def ask(self, key: str, messages: list[dict[str, str]], schema: dict[str, Any],
            max_tokens: int, accept: Callable[[str], object]) -> tuple[str, bool]:
        """The verdict's text for `key` and whether it came from the cache. `accept` raises on
        an answer that is not a verdict; only accepted answers are cached."""
        hit = self.cache.get(key)
        if hit is not None:
            return hit, True
        body = {"messages": messages, "max_tokens": max_tokens,
                "temperature": self.spec.temperature,
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "verdict", "schema": schema, "strict": True}}}
        retrying = Retrying(stop=stop_after_attempt(self.spec.retries + 1),
                            wait=wait_exponential(multiplier=0.5, max=8),
                            retry=retry_if_exception_type(_Retryable), reraise=True)
        try:
            content = retrying(self._attempt, body)
        except _Retryable as e:
            raise JudgeError(f"judge {self.name!r}: {e} (after {self.spec.retries + 1} "
                             "attempts); check the judge endpoint, or raise `retries`") from None
        accept(content)
        self.cache.put(key, content)
        return content, False

    def close(self) -> None:
        self._client.close()

    def _spend(self) -> None:
        with self._lock:
            if self.spent >= self.spec.max_calls:
                raise JudgeBudgetExhausted(
                    f"judge {self.name!r}: its budget of {self.spec.max_calls} calls is spent; "
                    "raise max_calls in the judge's [rewards] table of envhub.toml (verdicts "
                    "already given are cached and cost nothing again)")
            self.spent += 1

    def _attempt(self, body: dict[str, Any]) -> str:
        self._spend()
        if self.spec.base_url is not None:
            return self._chat(self.spec.base_url.rstrip("/"), self._external_key(), body)
        if self._gateway is None:
            raise JudgeError(f"judge {self.name!r}: no endpoint; set base_url in its [rewards] "
                             "table, or score inside `envhub run`/`envhub train`, which hand "
                             "the judge their gateway")
        gateway, admin = self._gateway
        opened = self._post(f"{gateway}/sessions", admin, {
            "env": "judge", "metadata": {"trainable": False, "role": "judge",
                                         "judge": self.name}})
        try:
            return self._chat(str(opened["base_url"]), str(opened["api_key"]), body)
        finally:
            self._post(f"{gateway}/sessions/{opened['session_id']}/close", admin,
                       {"status": "done"})

    def _external_key(self) -> str:
        var = self.spec.api_key_env
        if var is None:
            return "none"
        if not os.environ.get(var):
            raise JudgeError(f"judge {self.name!r}: environment variable {var} (api_key_env) "
                             "is not set; export the judge endpoint's API key in it")
        return os.environ[var]

    def _chat(self, base_url: str, key: str, body: dict[str, Any]) -> str:
        model = self.spec.model or self._served_model(base_url, key)
        data = self._post(f"{base_url}/chat/completions", key, {"model": model, **body})
        try:
            choice = data["choices"][0]
            content = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"judge {self.name!r}: {base_url} answered no chat completion "
                             "choice; give base_url of an OpenAI-compatible server") from None
        if not isinstance(content, str):
            return ""  # parsed (and refused) as a verdict by the caller
        return content[:MAX_CONTENT_CHARS]

    def _served_model(self, base_url: str, key: str) -> str:
        if self._served is None:
            data = self._request("GET", f"{base_url}/models", key, None)
            try:
                self._served = str(data["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise JudgeError(f"judge {self.name!r}: {base_url}/models lists no model; set "
                                 "`model` in the judge's [rewards] table") from None
        return self._served

    def _post(self, url: str, key: str | None, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", url, key, body)

    def _request(self, method: str, url: str, key: str | None,
                 body: dict[str, Any] | None) -> dict[str, Any]:
        """One exchange, its answer read up to MAX_BODY_BYTES. Raises _Retryable or JudgeError."""
        headers = {"authorization": f"Bearer {key}"} if key else {}
        try:
            with self._client.stream(method, url, json=body, headers=headers) as r:
                raw = bytearray()
                for chunk in r.iter_bytes():
                    raw += chunk
                    if len(raw) > MAX_BODY_BYTES:
                        raise JudgeError(f"judge {self.name!r}: {url} answered more than "
                                         f"{MAX_BODY_BYTES} bytes; not a verdict")
        except httpx.TransportError as e:
            raise _Retryable(f"{method} {url}: {type(e).__name__}: {e}") from None
        if r.status_code == 429 or r.status_code >= 500:
            raise _Retryable(f"{method} {url}: HTTP {r.status_code}: {bytes(raw[:300])!r}")
        if r.status_code >= 400:
            raise JudgeError(f"judge {self.name!r}: {method} {url}: HTTP {r.status_code}: "
                             f"{bytes(raw[:500]).decode(errors='replace')}; a 400 on "
                             "response_format means the endpoint has no structured outputs "
                             "(json_schema): use one that has (vLLM, SGLang, OpenAI, envhub)")
        try:
            data = json.loads(bytes(raw))
        except ValueError:
            raise JudgeError(f"judge {self.name!r}: {url} answered non-JSON") from None
        if not isinstance(data, dict):
            raise JudgeError(f"judge {self.name!r}: {url} answered JSON that is not an object")
        return data
