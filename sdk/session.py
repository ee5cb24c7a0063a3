"""Agent-side sessions: open one on a gateway, get an OpenAI client bound to it, report rewards.

Light on purpose: httpx and pydantic only (openai is imported when `.openai()` is called), so
agents can import it without torch or the server's dependencies.

    with Session.open("http://127.0.0.1:8400", admin_key=..., task_id="t1") as s:
        client = s.openai()
        client.chat.completions.create(model="default", messages=[...])
        s.reward("outcome", 1.0)

`Session` and `AsyncSession` are twins (httpx's convention): the same methods, awaited on the
async one, and `close` / `aclose` to end the session and release its HTTP connections.
"""

from __future__ import annotations

from typing import Any

import httpx

from envhub.sdk.types import SessionStatus, Trajectory


class GatewayError(RuntimeError):
    """The gateway refused a call; the message is the gateway's (it says what to fix)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"gateway answered {status}: {message}")
        self.status = status


def _check(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        try:
            message = resp.json()["error"]["message"]
        except Exception:
            message = resp.text[:500]
        raise GatewayError(resp.status_code, message)
    return resp.json()


def _create_body(group_id: str | None, task_id: str | None, env: str | None,
                 sample_index: int, metadata: dict | None, session_id: str | None) -> dict:
    return {"group_id": group_id, "task_id": task_id, "env": env, "sample_index": sample_index,
            "metadata": metadata or {}, "session_id": session_id}


def _reward_body(kind: str, value: float, name: str, seq: int | None, info: dict | None,
                 weight: float | None) -> dict:
    return {"kind": kind, "value": value, "name": name, "seq": seq, "info": info or {},
            "weight": weight}


def _close_body(status: str | SessionStatus, reason: str | None) -> dict:
    return {"status": status.value if isinstance(status, SessionStatus) else status,
            "reason": reason}


class _Base:
    """`admin_key`: kept by a session opened with it (`open(admin_key=...)`, the runner's): a
    gateway with an admin key takes rewards and closes from it only, never from the session's
    own key, which the agent holds (it could score itself or hide its failures)."""

    def __init__(self, gateway_url: str, session_id: str, api_key: str,
                 admin_key: str | None = None):
        self.gateway_url = gateway_url.rstrip("/")
        self.id = session_id
        self.api_key = api_key
        self._admin_key = admin_key
        self._closed = False  # close()/aclose() reached for the gateway once already

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL (…/v1); Anthropic clients take `gateway_url`."""
        return f"{self.gateway_url}/v1"

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"}

    def _writer_headers(self) -> dict[str, str]:
        """For rewards, signals and the close: the admin key when this session holds it."""
        return {"authorization": f"Bearer {self._admin_key or self.api_key}"}

    def _close_answer(self, resp: httpx.Response) -> None:
        """A close refused because only the session's key was sent (403 from a gateway with an
        admin key, where the runner decides the status) ends the client all the same."""
        if resp.status_code == 403 and self._admin_key is None:
            return
        _check(resp)

    def _path(self, what: str) -> str:
        return f"{self.gateway_url}/sessions/{self.id}/{what}"


class Session(_Base):
    """Synchronous session; `AsyncSession` is its async twin."""

    def __init__(self, gateway_url: str, session_id: str, api_key: str,
                 http: httpx.Client | None = None, admin_key: str | None = None):
        super().__init__(gateway_url, session_id, api_key, admin_key)
        self._http = http or httpx.Client(timeout=60)

    @classmethod
    def open(cls, gateway_url: str, *, admin_key: str | None = None,
             group_id: str | None = None, task_id: str | None = None, env: str | None = None,
             sample_index: int = 0, metadata: dict | None = None,
             session_id: str | None = None) -> Session:
        http = httpx.Client(timeout=60)
        headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
        try:
            data = _check(http.post(f"{gateway_url.rstrip('/')}/sessions", headers=headers,
                                    json=_create_body(group_id, task_id, env, sample_index,
                                                      metadata, session_id)))
        except BaseException:
            http.close()
            raise
        return cls(gateway_url, data["session_id"], data["api_key"], http, admin_key)

    @property
    def _client(self) -> httpx.Client:
        if self._http.is_closed:  # a read after close(), e.g. the final trajectory
            self._http = httpx.Client(timeout=60)
        return self._http

    def openai(self, **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def reward(self, kind: str, value: float, *, name: str = "", seq: int | None = None,
               info: dict | None = None, weight: float | None = None) -> None:
        _check(self._client.post(self._path("reward"), headers=self._writer_headers(),
                                 json=_reward_body(kind, value, name, seq, info, weight)))

    def signal(self, name: str, *, seq: int | None = None, value: float = 1.0,
               info: dict | None = None) -> None:
        _check(self._client.post(self._path("signal"), headers=self._writer_headers(),
                                 json={"name": name, "seq": seq, "value": value,
                                       "info": info or {}}))

    def context_action(self, kind: str, **fields: Any) -> None:
        """Declare a context-management action; it labels the next model call."""
        _check(self._client.post(self._path("context_action"), headers=self._headers(),
                                 json={"kind": kind, **fields}))

    def trajectory(self) -> Trajectory:
        return Trajectory.model_validate(
            _check(self._client.get(self._path("trajectory"), headers=self._headers())))

    def close(self, status: str | SessionStatus = "done", reason: str | None = None) -> None:
        """End the session with `status` and release the HTTP connections. Only the first call
        reaches the gateway, so a `with` block's exit keeps an explicit close's status; reads
        afterwards (the final `trajectory()`) still work."""
        try:
            if not self._closed:
                self._closed = True
                self._close_answer(self._http.post(self._path("close"),
                                                   headers=self._writer_headers(),
                                                   json=_close_body(status, reason)))
        finally:
            self._http.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close("agent_error" if exc_type else "done",
                   repr(_[0]) if exc_type else None)


class AsyncSession(_Base):
    """Async twin of `Session`."""

    def __init__(self, gateway_url: str, session_id: str, api_key: str,
                 http: httpx.AsyncClient | None = None, admin_key: str | None = None):
        super().__init__(gateway_url, session_id, api_key, admin_key)
        self._http = http or httpx.AsyncClient(timeout=60)

    @classmethod
    async def open(cls, gateway_url: str, *, admin_key: str | None = None,
                   group_id: str | None = None, task_id: str | None = None,
                   env: str | None = None, sample_index: int = 0, metadata: dict | None = None,
                   session_id: str | None = None) -> AsyncSession:
        http = httpx.AsyncClient(timeout=60)
        headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
        try:
            data = _check(await http.post(f"{gateway_url.rstrip('/')}/sessions",
                                          headers=headers,
                                          json=_create_body(group_id, task_id, env,
                                                            sample_index, metadata, session_id)))
        except BaseException:
            await http.aclose()
            raise
        return cls(gateway_url, data["session_id"], data["api_key"], http, admin_key)

    @property
    def _client(self) -> httpx.AsyncClient:
        if self._http.is_closed:  # a read after aclose(), e.g. the final trajectory
            self._http = httpx.AsyncClient(timeout=60)
        return self._http

    def openai(self, **kwargs: Any) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    async def reward(self, kind: str, value: float, *, name: str = "", seq: int | None = None,
                     info: dict | None = None, weight: float | None = None) -> None:
        _check(await self._client.post(self._path("reward"), headers=self._writer_headers(),
                                       json=_reward_body(kind, value, name, seq, info, weight)))

    async def signal(self, name: str, *, seq: int | None = None, value: float = 1.0,
                     info: dict | None = None) -> None:
        _check(await self._client.post(self._path("signal"), headers=self._writer_headers(),
                                       json={"name": name, "seq": seq, "value": value,
                                             "info": info or {}}))

    async def context_action(self, kind: str, **fields: Any) -> None:
        _check(await self._client.post(self._path("context_action"), headers=self._headers(),
                                       json={"kind": kind, **fields}))

    async def trajectory(self) -> Trajectory:
        return Trajectory.model_validate(
            _check(await self._client.get(self._path("trajectory"), headers=self._headers())))

    async def aclose(self, status: str | SessionStatus = "done",
                     reason: str | None = None) -> None:
        """Async twin of `Session.close`: end the session with `status` (first call only) and
        release the HTTP connections."""
        try:
            if not self._closed:
                self._closed = True
                self._close_answer(await self._http.post(self._path("close"),
                                                         headers=self._writer_headers(),
                                                         json=_close_body(status, reason)))
        finally:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, exc_type: Any, *_: Any) -> None:
        await self.aclose("agent_error" if exc_type else "done",
                          repr(_[0]) if exc_type else None)
