"""`envhub serve ENV`: any envhub environment as a task service (protocol: __init__.py). It
serves the environment's tasks and runs the rollouts it is asked for (setup, its agent,
grading) in the orchestrator's sessions, and keeps itself registered: it registers, heartbeats,
and registers again when the orchestrator restarted or forgot it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import cast

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from envhub.envs.agents import agent_for, make_agent
from envhub.envs.loader import LoadedEnv
from envhub.orchestrator.groups.attached import RemoteRollout, attached_rollout
from envhub.orchestrator.groups.plan import RolloutKey
from envhub.orchestrator.groups.services.protocol import (
    EnvDescription,
    Registered,
    Registration,
    RolloutReport,
    RolloutRequest,
    Status,
    TaskRow,
    VerdictBody,
    answer_bad_requests,
)
from envhub.orchestrator.groups.setup import load_envs

log = logging.getLogger(__name__)
RETRY_S = 1.0  # between registration attempts while the orchestrator is not there


@dataclass
class ServeOptions:
    env: str
    orchestrator: str  # the hub's URL (envhub run --services HOST:PORT)
    token: str = ""  # the run's services token
    name: str | None = None  # registered as; default the environment's name
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None  # the URL the orchestrator reaches this at
    capacity: int = 64
    agent: str | None = None  # default: the environment's own (envs.agents.agent_for)
    agent_install: tuple[str, ...] = ()
    sandbox: str | None = None


class TaskService:
    def __init__(self, opts: ServeOptions, loaded: LoadedEnv, kind: str) -> None:
        self.opts, self.loaded, self.kind = opts, loaded, kind
        self.name = opts.name or loaded.name
        self.tasks = {t.id: t for t in loaded.env.load_tasks()}
        self.agent_spec = agent_for(opts.agent, loaded.env, self.name)  # RunConfigError
        self.agent = make_agent(self.agent_spec, list(opts.agent_install), False)
        self.in_flight = 0

    def describe(self) -> EnvDescription:
        m = self.loaded.manifest
        rewards = {k: (v if isinstance(v, float) else v.weight) for k, v in m.rewards.items()}
        return EnvDescription(name=self.name, version=m.version, description=m.description,
                              rewards=rewards,
                              tasks=[TaskRow(id=t.id, instruction=t.instruction, data=t.data)
                                     for t in self.tasks.values()])

    async def rollout(self, req: RolloutRequest) -> RolloutReport | JSONResponse:
        task = self.tasks.get(req.task_id)
        if task is None:
            return JSONResponse({"error": f"no task {req.task_id!r} in {self.name}"}, 404)
        job = RemoteRollout(
            key=RolloutKey(self.name, task.id, req.sample), group_id=req.group_id,
            env_ref=self.opts.env, task=task, run_id=f"svc-{self.name}", agent=self.agent_spec,
            agent_install=list(self.opts.agent_install), agent_on_host=False,
            sandbox_kind=self.kind, agent_kind=None, model="default",
            limits_override=req.limits.model_dump(exclude_none=True),
            gateway_url=req.gateway_url, session_id=req.session_id, api_key=req.api_key)
        self.in_flight += 1
        try:
            p = await attached_rollout(job, self.loaded, self.agent)
        finally:
            self.in_flight -= 1
        v = p.verdict
        verdict = None if v is None else VerdictBody(
            outcome=v.outcome, resolved=v.resolved, info=v.info, env_failure=v.env_failure,
            signals=v.signals)
        return RolloutReport(status=cast(Status, p.status), reason=p.reason, stopped=p.stopped,
                             turns=p.turns, verdict=verdict, duration_s=p.duration_s,
                             setup_s=p.setup_s, verify_s=p.verify_s, signals=p.signals)


def service_app(service: TaskService) -> FastAPI:
    app = FastAPI(title=f"envhub task service {service.name}", docs_url=None, redoc_url=None)

    answer_bad_requests(app)

    @app.get("/v1/env")
    async def env() -> EnvDescription:
        return service.describe()

    @app.post("/v1/rollouts", response_model=None)
    async def rollout(req: RolloutRequest) -> RolloutReport | JSONResponse:
        return await service.rollout(req)

    return app


def keep_registered(service: TaskService, url: str, stop: threading.Event) -> None:
    """Register at the orchestrator, heartbeat, register again on 404; retry while it is
    unreachable (a service may start before its run). Runs on a thread of its own: a loop
    busy with hundreds of rollouts would send its heartbeats late, and the orchestrator would
    take the service for dead (seen at 500 rollouts per service)."""
    orchestrator = service.opts.orchestrator.rstrip("/")
    reg = Registration(name=service.name, url=url, capacity=service.opts.capacity)
    headers = {"authorization": f"Bearer {service.opts.token}"}
    with httpx.Client(timeout=10, headers=headers) as http:
        me: Registered | None = None
        while not stop.is_set():
            try:
                if me is None:
                    r = http.post(f"{orchestrator}/v1/services", content=reg.model_dump_json(),
                                  headers={"content-type": "application/json"})
                    r.raise_for_status()
                    me = Registered.model_validate_json(r.content)
                    log.warning("registered %s at %s as %s", service.name, orchestrator, me.id)
                else:
                    r = http.post(f"{orchestrator}/v1/services/{me.id}/heartbeat",
                                  json={"in_flight": service.in_flight})
                    if r.status_code == 404:
                        me = None
                        continue
                    r.raise_for_status()
            except httpx.HTTPError as e:
                refused = isinstance(e, httpx.HTTPStatusError) and e.response.status_code == 401
                if refused:
                    log.error("the orchestrator at %s refused the token: give the run's "
                              "(--token or ENVHUB_SERVICES_TOKEN)", orchestrator)
                log.debug("orchestrator at %s: %s", orchestrator, e)
                me = None
            stop.wait(me.heartbeat_s / 2 if me is not None else RETRY_S)


async def serve(opts: ServeOptions) -> None:
    """Serve until SIGINT/SIGTERM. Raises the loader's errors (with the fix) up front."""
    import uvicorn

    from envhub.orchestrator.groups.setup import raise_open_files_limit
    from envhub.sdk.serve import KEEP_ALIVE_S, bind

    raise_open_files_limit()  # a connection or two per rollout in flight
    loaded_by_ref, kinds = await asyncio.to_thread(load_envs, [opts.env], opts.sandbox)
    service = TaskService(opts, loaded_by_ref[opts.env], kinds[opts.env])
    sock = bind(opts.host, opts.port)
    url = (opts.advertise or f"http://{opts.host}:{sock.getsockname()[1]}").rstrip("/")
    server = uvicorn.Server(uvicorn.Config(service_app(service), log_level="warning",
                                           timeout_keep_alive=KEEP_ALIVE_S))
    stop = threading.Event()
    registering = threading.Thread(target=keep_registered, args=(service, url, stop),
                                   name="envhub-serve-heartbeat", daemon=True)
    registering.start()
    print(f"envhub serve: {service.name} ({len(service.tasks)} tasks) at {url}, "
          f"registering with {opts.orchestrator}", flush=True)
    started = time.monotonic()
    try:
        await server.serve(sockets=[sock])
    finally:
        stop.set()
        await asyncio.to_thread(registering.join, 30)
        log.info("served %s for %.0fs", service.name, time.monotonic() - started)
