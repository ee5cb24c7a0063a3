"""The runner's gateway: one started in-process (default) or an existing one (`--gateway URL`).

The runner reaches it over HTTP only (through the SDK's session client), never through its
internals, so both cases behave the same.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from pathlib import Path
from typing import Any

from envhub.envs.errors import RunConfigError
from envhub.orchestrator.groups.plan import RolloutKey

CLOSE_TIMEOUT_S = 120.0  # a loaded machine's gateway may answer slowly; the run waits on it
# Launches wait while the gateway's /health says not ready (its pool cannot write: a full disk,
# a database restarting), up to this long; then the rollout is env_failure with the reason.
READY_WAIT_S = 600.0
READY_FRESH_S = 1.0  # a ready answer this recent is taken as it is (one look per second)
INTERRUPTED = "interrupted"  # why a rollout cancelled by the run stopping is env_failure
PROVIDER_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}


log = logging.getLogger(__name__)


class GatewayLink:
    def __init__(self, url: str, admin_key: str, handle: Any = None) -> None:
        self.url, self.admin_key, self._handle = url.rstrip("/"), admin_key, handle
        self._ready_at = -READY_FRESH_S  # when /health last said ready (monotonic)

    @classmethod
    async def start(cls, model: str | None, db_path: Path, host: str = "127.0.0.1"
                    ) -> GatewayLink:
        """Start a gateway in this process (model None: the bundled tiny model), pool in
        `db_path` (SQLite), listening on `host` (where the rollouts reach it)."""
        from envhub.gateway.server import GatewayConfig, run_in_thread

        key = "envhub-admin-" + secrets.token_urlsafe(24)
        try:
            config = GatewayConfig(host=host, port=0, db=f"sqlite:///{db_path}", admin_key=key,
                                   **model_options(model))
            handle = await asyncio.to_thread(run_in_thread, config)
        except RunConfigError:
            raise
        except Exception as e:  # the gateway's own errors state their fix; add ours
            raise RunConfigError(
                f"cannot start the in-process gateway for --model {model or '(bundled)'}: "
                f"{type(e).__name__}: {e}. Or start one yourself (`envhub gateway ...`) and "
                "pass --gateway URL --admin-key KEY") from e
        return cls(handle.url, getattr(handle, "admin_key", None) or key, handle)

    @classmethod
    def connect(cls, url: str, admin_key: str) -> GatewayLink:
        return cls(url, admin_key)

    async def ready(self, limit_s: float = READY_WAIT_S) -> None:
        """Return once the gateway is ready for a new rollout: its /health not 503 (a pool that
        cannot write says so there, and recovers by itself); waits as its Retry-After says,
        up to `limit_s`, then raises RuntimeError with the gateway's reason. An unreachable
        gateway is left to the call that follows (it fails with its own error)."""
        import time

        import httpx

        if time.monotonic() - self._ready_at < READY_FRESH_S:
            return
        deadline = time.monotonic() + limit_s
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                try:
                    r = await http.get(f"{self.url}/health")
                except httpx.TimeoutException:  # answering nothing in time: not ready
                    r = None
                except httpx.TransportError:  # not there at all: the call says so itself
                    return
                if r is not None and r.status_code != 503:
                    self._ready_at = time.monotonic()
                    return
                why = "its /health did not answer" if r is None else _not_ready_reason(r)
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"the gateway was not ready for {limit_s:g} s: {why}")
                try:
                    wait = float(r.headers.get("retry-after", "1")) if r is not None else 1.0
                except ValueError:  # an HTTP date: not ours
                    wait = 1.0
                left = max(0.0, deadline - time.monotonic())
                await asyncio.sleep(min(max(wait, 0.2), 10.0, left))

    async def open_session(self, group_id: str, key: RolloutKey) -> Any:
        """A session for one rollout, once the gateway is ready (launches pause while its
        pool cannot write).

        The gateway may have created the session when its answer never reaches us: the
        rollout was cancelled while waiting for it (the run stopping), or the connection
        broke or timed out. Such a session would stay open in the pool for ever, its group
        never whole. So the id is ours (chosen here), a cancelled open waits for the answer
        (bounded by the HTTP timeout) and a failed one is closed by id with the admin key,
        either way as env_failure; then the cancellation or the error goes on."""
        import httpx

        from envhub.sdk import AsyncSession

        await self.ready()
        sid = uuid.uuid4().hex
        opening = asyncio.ensure_future(AsyncSession.open(
            self.url, admin_key=self.admin_key, group_id=group_id, task_id=key.task_id,
            env=key.env, sample_index=key.sample, session_id=sid))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            await asyncio.shield(self._abandon(opening, sid, INTERRUPTED))
            raise
        except httpx.TransportError as e:  # no answer is not "not created"
            await self._abandon(opening, sid, f"its opening got no answer: "
                                              f"{type(e).__name__}: {e}")
            raise

    async def _abandon(self, opening: asyncio.Future[Any], sid: str, reason: str) -> None:
        """End the session `opening` may have created, unscored."""
        import httpx

        try:
            session = await opening
        except Exception:  # noqa: BLE001 - no session object: close it by its id
            session = None
        if session is not None:
            try:
                await session.aclose(status="env_failure", reason=reason)
                return
            except Exception:  # noqa: BLE001 - its own close failed: the admin key's next
                pass
        try:
            await self.close_session(sid, "env_failure", reason)
        except httpx.HTTPStatusError as e:  # 404: the gateway never created it
            if e.response.status_code != 404:
                log.warning("closing session %s after its open failed: %s", sid, e)
        except httpx.HTTPError as e:  # the gateway gone: resume closes what is left open
            log.warning("closing session %s after its open failed: %s", sid, e)

    async def pool_refusals(self, session_id: str, key: str | None = None
                            ) -> tuple[int, str | None]:
        """How many of the session's calls the gateway refused because its pool could not
        record them, and why (`pool_refusals`): asked with the session's own `key` where
        given (the counts live in the process that served the calls, which a proxy in front
        of several gateways picks by that key), else the admin key."""
        return await pool_refusals(self.url, session_id, key or self.admin_key)

    async def close_session(self, session_id: str, status: str, reason: str | None) -> None:
        """Close a session with the admin key: the fallback when the session's own close did
        not get through (e.g. a timeout on a loaded machine). Transport errors are retried;
        closing twice is harmless (the status is written again)."""
        import httpx
        from tenacity import (
            AsyncRetrying,
            retry_if_exception_type,
            stop_after_attempt,
            wait_exponential,
        )

        async with httpx.AsyncClient(timeout=CLOSE_TIMEOUT_S) as http:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type(httpx.TransportError),
                    stop=stop_after_attempt(3), wait=wait_exponential(min=1, max=10),
                    reraise=True):
                with attempt:
                    r = await http.post(f"{self.url}/sessions/{session_id}/close",
                                        headers={"authorization": f"Bearer {self.admin_key}"},
                                        json={"status": status, "reason": reason})
                    r.raise_for_status()

    async def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            await asyncio.to_thread(handle.close)


async def pool_refusals(url: str, session_id: str, key: str | None) -> tuple[int, str | None]:
    """`GET /sessions/{id}/pool_faults` with `key` (the admin key, or the session's own): how
    many of its calls the gateway refused because its pool could not record them, and why. 0
    when it cannot say (an older gateway, another process served them, not reachable): the
    rollout then ends as it would have."""
    import httpx

    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.get(f"{url.rstrip('/')}/sessions/{session_id}/pool_faults",
                               headers=headers)
        if r.status_code != 200:
            return 0, None
        body = r.json()
        return int(body.get("refused") or 0), body.get("reason")
    except (httpx.HTTPError, ValueError, TypeError, AttributeError):
        return 0, None


def _not_ready_reason(r: Any) -> str:
    """What a 503 from /health says is wrong (its `pool` field, else its text)."""
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("pool"):
        return str(body["pool"])
    return str(r.text[:200])


def model_options(model: str | None) -> dict[str, Any]:
    """GatewayConfig fields for `--model`: None → the bundled tiny model on the local engine;
    an existing folder → that HF model on the local engine; `zero` → the zero-work backend
    (instant fixed completions, for measuring the runner); `scripted:FILE` → the scripted
    backend answering FILE's texts (a JSON list) in order through the bundled tokenizer (demos,
    audits, end-to-end checks of an agent); `provider/name` → a hosted model through the
    `openai` (litellm) backend."""
    if model is None:
        return {}
    if Path(model).expanduser().is_dir():
        return {"model": str(Path(model).expanduser())}
    if model == "zero":
        return {"backend": "zero"}
    if model.startswith("scripted:"):
        return scripted_options(model.removeprefix("scripted:"))
    provider, sep, _ = model.partition("/")
    if not sep or provider not in PROVIDER_URLS:
        raise RunConfigError(
            f"--model {model!r}: not a model folder; for a hosted model use provider/name with "
            f"provider one of {', '.join(PROVIDER_URLS)} (e.g. openai/gpt-4.1), `zero`, or "
            "`scripted:FILE`")
    # LiteLLM reads the provider's key from its usual variable (OPENAI_API_KEY, ...).
    return {"backend": "openai", "model_name": model,
            "upstreams": [f"openai={PROVIDER_URLS[provider]}"]}


def scripted_options(script: str) -> dict[str, Any]:
    """GatewayConfig fields for `--model scripted:FILE` (the file must exist: checked here, before
    the gateway starts)."""
    path = Path(script).expanduser()
    if not path.is_file():
        raise RunConfigError(f"--model scripted:{script}: no such file; give a JSON list of "
                             "completion texts, e.g. scripted:./script.json")
    return {"backend": "scripted", "script": str(path.resolve())}
