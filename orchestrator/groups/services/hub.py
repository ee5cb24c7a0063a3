"""The orchestrator's side of task services: where they register (an HTTP server of its own),
and the executor of `service:NAME` environments (it asks a live service of that name to run
each rollout). Protocol and failure accounting: __init__.py.

    hub = ServiceHub("127.0.0.1:7000", token)
    await hub.start()
    loaded = hub.describe("echo")            # waits for a service named echo; its tasks
    pending = await hub.execute(key, group_id, loaded, task, setup)
    await hub.close()
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from envhub.envs.environment import Task, Verdict
from envhub.envs.errors import RunConfigError
from envhub.envs.loader import LoadedEnv
from envhub.envs.manifest import Manifest, SandboxSpec
from envhub.orchestrator.groups.attached import post_held_signals, with_session
from envhub.orchestrator.groups.config import SERVED, ServicesOptions, listen_address
from envhub.orchestrator.groups.plan import RolloutKey
from envhub.orchestrator.groups.rollout import PendingRollout, RolloutSetup
from envhub.orchestrator.groups.scoring import close_session
from envhub.orchestrator.groups.services.protocol import (
    EnvDescription,
    Heartbeat,
    Limits,
    Registered,
    Registration,
    RolloutReport,
    RolloutRequest,
    answer_bad_requests,
)
from envhub.orchestrator.groups.task_metrics import TaskMetrics

PREFIX = SERVED  # an environment reference served by a task service: service:NAME
HEARTBEAT_S = 2.0
HEARTBEATS_MISSED = 5  # a service silent this many periods is taken as dead
MAX_ANSWER = 16 << 20  # bytes of one rollout's answer


@dataclass
class _Service:
    id: str
    name: str
    url: str
    capacity: int
    last_beat: float
    busy: int = 0  # our requests outstanding
    reported: int = 0  # what its last heartbeat said


class ServiceHub:
    """Registered services, their liveness and load; the `RolloutExecutor` of their
    environments."""

    name = "services"

    def __init__(self, listen: str, token: str | None = None, heartbeat_s: float = HEARTBEAT_S,
                 wait_s: float = 60.0) -> None:
        self.host, self.port = listen_address(listen, "--services")
        self.heartbeat_s, self.wait_s = heartbeat_s, wait_s
        # Whoever registers is asked for rollouts and reports their verdicts: only holders of
        # the token may (an agent that reaches this port must not register a grader of its own).
        self.token = token or secrets.token_urlsafe(24)
        self.metrics = TaskMetrics()  # per task, of every environment of the run: /metrics
        self._services: dict[str, _Service] = {}
        self._lock = threading.Lock()  # the server thread registers, the run's loop reads
        self._server: Any = None
        self._http: httpx.AsyncClient | None = None
        self.url = ""

    # -- the registry (server thread and run loop alike) ---------------------------------
    def register(self, reg: Registration) -> Registered:
        service = _Service(uuid.uuid4().hex, reg.name, reg.url.rstrip("/"), reg.capacity,
                           time.monotonic())
        with self._lock:
            self._services[service.id] = service
        return Registered(id=service.id, heartbeat_s=self.heartbeat_s)

    def beat(self, service_id: str, beat: Heartbeat) -> bool:
        with self._lock:
            service = self._services.get(service_id)
            if service is None or not self._alive(service):
                self._services.pop(service_id, None)
                return False
            service.last_beat, service.reported = time.monotonic(), beat.in_flight
            return True

    def listing(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"id": s.id, "name": s.name, "url": s.url, "capacity": s.capacity,
                     "in_flight": s.busy, "reported_in_flight": s.reported,
                     "alive": self._alive(s)}
                    for s in self._services.values()]

    def _alive(self, service: _Service) -> bool:
        return time.monotonic() - service.last_beat < self.heartbeat_s * HEARTBEATS_MISSED

    def _seen(self, service: _Service) -> None:
        with self._lock:
            service.last_beat = max(service.last_beat, time.monotonic())

    def _drop(self, service: _Service) -> None:
        """Forget a service that died: its heartbeat gets 404 if it is alive after all, and it
        registers again."""
        with self._lock:
            self._services.pop(service.id, None)

    def _take(self, name: str) -> _Service | None:
        """The least busy live service of `name` with a free slot, its slot taken."""
        with self._lock:
            free = [s for s in self._services.values()
                    if s.name == name and self._alive(s) and s.busy < s.capacity]
            if not free:
                return None
            service = min(free, key=lambda s: s.busy / s.capacity)
            service.busy += 1
            return service

    async def _acquire(self, name: str) -> _Service | None:
        """A slot of a live service of `name`: waits while they are all busy (queueing, not a
        failure), gives up (None) after wait_s without any live one."""
        deadline = time.monotonic() + self.wait_s
        while (service := self._take(name)) is None:
            if self._live(name) is not None:
                deadline = time.monotonic() + self.wait_s
            elif time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.05)
        return service

    # -- executor ------------------------------------------------------------------------
    def open(self) -> str:
        """Listen for services (once; also done by `start`); returns the URL they register at.
        Raises RunConfigError when the address cannot be bound."""
        from envhub.sdk.serve import serve_in_thread

        if self._server is None:
            try:
                self._server = serve_in_thread(hub_app(self), self.host, self.port,
                                               name="envhub-services")
            except OSError as e:
                raise RunConfigError(f"--services {self.host}:{self.port}: cannot listen: {e}; "
                                     "pick a free port") from None
            self.url = self._server.url
        return self.url

    async def start(self) -> None:
        self.open()

    def _client(self) -> httpx.AsyncClient:
        """The client of rollout requests, made on the loop that runs them."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None),
                                           limits=httpx.Limits(max_connections=None,
                                                               max_keepalive_connections=64))
        return self._http

    def gateway_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    async def check(self, loaded: LoadedEnv, sandbox_kind: str) -> None:
        return None

    def describe(self, name: str) -> LoadedEnv:
        """The environment a service of `name` serves, as the first live one describes it
        (blocks up to wait_s for one to register). Raises RunConfigError with the fix."""
        deadline = time.monotonic() + self.wait_s
        while (service := self._live(name)) is None:
            if time.monotonic() > deadline:
                raise RunConfigError(
                    f"no task service named {name} registered at {self.url} within "
                    f"{self.wait_s:g}s; start one, e.g. `envhub serve ENV --name {name} "
                    f"--orchestrator {self.url} --token TOKEN`")
            time.sleep(0.1)
        try:
            r = httpx.get(f"{service.url}/v1/env", timeout=30.0)
            r.raise_for_status()
            described = EnvDescription.model_validate_json(r.content)
            manifest = Manifest(name=name, version=described.version,
                                description=described.description, entrypoint="service:remote",
                                sandbox=SandboxSpec(kind="none"), tools=[],
                                rewards=dict(described.rewards))
        except (httpx.HTTPError, ValidationError) as e:
            raise RunConfigError(f"task service {name} at {service.url}: GET /v1/env: "
                                 f"{type(e).__name__}: {str(e)[:300]}") from None
        tasks = [Task(t.id, t.instruction, t.data) for t in described.tasks]
        return LoadedEnv(Path("."), manifest, ServedEnvironment(manifest, tasks),
                         f"{PREFIX}{name}")

    def _live(self, name: str) -> _Service | None:
        with self._lock:
            return next((s for s in self._services.values()
                         if s.name == name and self._alive(s)), None)

    def _release(self, service: _Service) -> None:
        with self._lock:
            service.busy -= 1

    async def execute(self, key: RolloutKey, group_id: str, loaded: LoadedEnv, task: Task,
                      rs: RolloutSetup) -> PendingRollout:
        p = await with_session(key, group_id, rs)
        if p.session is None:
            return p
        try:
            service = await self._acquire(loaded.name)
            if service is None:
                return p.fail("env_failure", f"no live task service {loaded.name} for "
                              f"{self.wait_s:g}s")
            try:
                report = await self._ask(service, self._request(key, group_id, task, rs, p))
            finally:
                self._release(service)
        except asyncio.CancelledError:  # interrupted: end its session unscored
            await asyncio.shield(close_session(p.session, "env_failure", "interrupted"))
            raise
        except _ServiceFailed as e:
            return p.fail("env_failure", f"task service {loaded.name} ({e.url}): {e}")
        p.status, p.reason, p.stopped, p.turns = (report.status, report.reason, report.stopped,
                                                  report.turns)
        if report.verdict is not None:
            v = report.verdict
            p.verdict = Verdict(v.outcome, v.resolved, v.info, v.env_failure, v.signals)
        p.duration_s, p.setup_s, p.verify_s = report.duration_s, report.setup_s, report.verify_s
        p.node = {"service": service.url}
        return await post_held_signals(p, report.signals)

    @staticmethod
    def _request(key: RolloutKey, group_id: str, task: Task, rs: RolloutSetup,
                 p: PendingRollout) -> RolloutRequest:
        return RolloutRequest(
            rollout_id=f"{group_id}:{key.sample}", group_id=group_id, task_id=task.id,
            sample=key.sample, gateway_url=rs.link.url, session_id=str(p.session.id),
            api_key=str(p.session.api_key), limits=Limits(**rs.limits_override))

    async def _ask(self, service: _Service, request: RolloutRequest) -> RolloutReport:
        """POST the rollout and wait for its answer while the service heartbeats."""
        call = asyncio.ensure_future(self._post(f"{service.url}/v1/rollouts",
                                                request.model_dump_json()))
        url = service.url
        try:
            while not (await asyncio.wait({call}, timeout=self.heartbeat_s))[0]:
                if not self._alive(service):
                    self._drop(service)
                    silent = self.heartbeat_s * HEARTBEATS_MISSED
                    raise _ServiceFailed(url, f"stopped heartbeating for {silent:g}s mid-rollout")
            code, body = call.result()
            self._seen(service)  # an answer is a sign of life too
        except httpx.TransportError as e:  # killed mid-rollout, or gone before it
            self._drop(service)
            raise _ServiceFailed(url, f"connection lost mid-rollout ({type(e).__name__}: "
                                 f"{str(e)[:200] or 'no detail'})") from None
        finally:
            if not call.done():
                call.cancel()
        if body is None:
            raise _ServiceFailed(url, f"answered more than {MAX_ANSWER} bytes")
        if code != 200:
            text = body[:300].decode(errors="replace")
            raise _ServiceFailed(url, f"answered HTTP {code}: {text}")
        try:
            return RolloutReport.model_validate_json(body)
        except ValidationError as e:
            raise _ServiceFailed(url, f"answered what is not a rollout report: "
                                 f"{str(e)[:300]}") from None

    async def _post(self, url: str, body: str) -> tuple[int, bytes | None]:
        """(status, answer); the answer None past MAX_ANSWER bytes (not read further)."""
        async with self._client().stream("POST", url, content=body,
                                         headers={"content-type": "application/json"}) as r:
            chunks, size = [], 0
            async for chunk in r.aiter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER:
                    return r.status_code, None
                chunks.append(chunk)
            return r.status_code, b"".join(chunks)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        await asyncio.to_thread(self.stop_listening)

    def stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def open_hub(options: ServicesOptions, log: Callable[[str], Any]) -> ServiceHub | None:
    """The hub of `--services`, listening (its URL printed, and the token when generated);
    None without --services. Whoever gets it closes it (`close`, or `stop_listening`)."""
    if not options.services:
        return None
    hub = ServiceHub(options.services, options.services_token, wait_s=options.service_wait_s)
    url = hub.open()
    log(f"task services register at {url}" + ("" if options.services_token else
        f" with the token {hub.token} (envhub serve --token, or ENVHUB_SERVICES_TOKEN)"))
    return hub


def served_envs(hub: ServiceHub | None, refs: list[str]) -> dict[str, LoadedEnv]:
    """The environments of the service:NAME references among `refs`, each once its first
    service registered (blocking: up to the hub's wait)."""
    if hub is None:
        return {}
    return {r: hub.describe(r.removeprefix(PREFIX)) for r in refs if r.startswith(PREFIX)}


class _ServiceFailed(Exception):
    def __init__(self, url: str, why: str) -> None:
        super().__init__(why)
        self.url = url


class ServedEnvironment:
    """An environment whose rollouts run in its task service: here only its tasks."""

    def __init__(self, manifest: Manifest, tasks: list[Task]) -> None:
        self.manifest, self._tasks = manifest, tasks

    def load_tasks(self) -> list[Task]:
        return list(self._tasks)

    def tools(self, task: Task) -> list[str]:
        return []

    async def setup(self, task: Task, ctx: Any) -> Any:
        raise RuntimeError(ELSEWHERE)

    async def solve(self, task: Task, sandbox: Any, ctx: Any) -> None:
        raise RuntimeError(ELSEWHERE)

    async def verify(self, task: Task, sandbox: Any, ctx: Any) -> Verdict:
        raise RuntimeError(ELSEWHERE)


ELSEWHERE = "a served environment's rollouts run in its task service (ServiceHub.execute)"


def hub_app(hub: ServiceHub) -> FastAPI:
    app = FastAPI(title="envhub task services", docs_url=None, redoc_url=None)
    expected = f"Bearer {hub.token}".encode()

    @app.middleware("http")
    async def _token(request: Request, call_next: Any) -> Response:
        given = request.headers.get("authorization", "").encode()
        if request.url.path != "/metrics" and not hmac.compare_digest(given, expected):
            return JSONResponse({"error": "a task service needs the run's token as a bearer "
                                 "token (envhub serve --token, ENVHUB_SERVICES_TOKEN)"},
                                status_code=401)
        return await call_next(request)

    answer_bad_requests(app)

    @app.post("/v1/services")
    async def register(reg: Registration) -> Registered:
        return hub.register(reg)

    @app.post("/v1/services/{service_id}/heartbeat", status_code=204)
    async def heartbeat(service_id: str, beat: Heartbeat) -> Response:
        if not hub.beat(service_id, beat):
            return JSONResponse({"error": f"unknown service {service_id}: register again"},
                                status_code=404)
        return Response(status_code=204)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(hub.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/services")
    async def services() -> list[dict[str, Any]]:
        return hub.listing()

    return app
