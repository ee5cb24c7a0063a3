"""The fleet: many engine instances behind one `Backend`.

- Routing: a session sticks to one instance (KV-cache reuse); new sessions go to the
  least-loaded instance in rotation (fleet/placement.py).
- Heartbeats (fleet/heartbeat.py): each instance is probed every `heartbeat_interval` s; one
  that misses `heartbeat_misses` beats, fails that many calls in a row, or drops a connection
  is taken out of rotation (drained: running calls finish or fail over), and put back after
  as many answered probes in a row (after re-loading the fleet's weights if it missed an
  update).
- Failover: this is the one place that retries (tenacity). Retryable = the instance could not
  answer: connection refused/reset, timeout, 5xx (all `BackendUnavailable`) and 429
  (`Overloaded`). Each retry goes to an instance the call has not tried yet; attempts are
  bounded by `fleet_retries + 1`. The gateway records a turn once, after `generate` returns,
  so a retried call is still exactly one turn.
- Weight versions: every result carries the version the engine reported for it;
  `update_weights` pauses new calls, drains running ones, loads the weights on every instance
  in rotation, bumps the version and resumes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from envhub.gateway.backends import backend_class
from envhub.gateway.backends.base import Backend, GenerateRequest, GenerateResult
from envhub.gateway.config import GatewayConfig
from envhub.gateway.errors import BackendUnavailable, BadRequest, GatewayError, Overloaded
from envhub.gateway.fleet.gate import PauseGate
from envhub.gateway.fleet.instance import Instance
from envhub.gateway.fleet.metrics import FleetMetrics
from envhub.gateway.fleet.placement import Placement
from envhub.gateway.fleet.upstreams import (
    UpstreamSpec,
    check_unique,
    load_fleet_file,
    parse_upstream,
)

__all__ = ["Fleet", "fleet_specs", "make_fleet"]

RETRYABLE = (BackendUnavailable, Overloaded)
# A dropped or refused connection means the process is gone: drain it now, not after N beats.
_CONNECTION_LOST = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError,
                    httpx.WriteError)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, RETRYABLE)


def _connection_lost(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, _CONNECTION_LOST)


class Fleet:
    """A `Backend` over several members (VLLMBackend, SGLangBackend, LiteLLMBackend, ...)."""

    name = "fleet"
    instance = "fleet"

    def __init__(self, members: Sequence[Backend], *, heartbeat_interval: float = 1.0,
                 heartbeat_timeout: float = 2.0, heartbeat_misses: int = 2, retries: int = 2,
                 pause_wait: float = 60.0, load_factor: float = 1.5):
        if not members:
            raise ValueError("a fleet needs at least one instance")
        self.instances: dict[str, Instance] = {}
        for m in members:
            if m.instance in self.instances:
                raise ValueError(f"two instances are named {m.instance!r}")
            self.instances[m.instance] = Instance(m.instance, m, weight_version=m.weight_version)
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.heartbeat_misses = heartbeat_misses
        self.retries = retries
        self.pause_wait = pause_wait
        self.placement = Placement(list(self.instances), load_factor)
        self.gate = PauseGate()
        self.metrics = FleetMetrics(self.instances.values, self._state)
        self.weight_version = max(m.weight_version for m in members)
        self.weights_path: str | None = None  # last weights pushed; re-pushed on recovery
        self.in_flight = 0
        self.beats = 0  # completed heartbeat rounds
        self._idle = asyncio.Event()
        self._idle.set()
        self._updating = asyncio.Lock()
        self._heartbeat: asyncio.Task[None] | None = None
        self._probed = asyncio.Event()  # set after the first round of probes

    # -- Backend -----------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if not self._probed.is_set():
            await self.start()
        await self.gate.enter(self.pause_wait)
        # No await between the gate and this increment: a drain that starts now sees the call.
        self.in_flight += 1
        self._idle.clear()
        try:
            return await self._with_retries(request)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def health(self) -> dict[str, Any]:
        """The fleet's state as last probed (no probing here: /health must stay cheap)."""
        up = sum(i.in_rotation for i in self.instances.values())
        return {"backend": self.name, "status": "ok" if up else "down",
                "weight_version": self.weight_version, "paused": self.gate.paused,
                "instances_up": up, "instances": [i.describe() for i in self.instances.values()]}

    async def aclose(self) -> None:
        await self.stop()
        await asyncio.gather(*(i.member.aclose() for i in self.instances.values()),
                             return_exceptions=True)

    async def load_weights(self, path: str, version: int | None = None) -> int:
        return (await self.update_weights(path, version))["weight_version"]

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the heartbeats; returns once every instance was probed once (so calls can be
        routed). The gateway's lifespan calls it; the first call starts it otherwise."""
        from envhub.gateway.fleet.heartbeat import beat_forever, probe_all

        if self._heartbeat is None:  # no await before the task exists: started only once
            async def beats() -> None:
                await probe_all(self)
                self._probed.set()
                await beat_forever(self)

            self._heartbeat = asyncio.create_task(beats(), name="envhub-fleet-heartbeat")
        await self._probed.wait()

    async def stop(self) -> None:
        task, self._heartbeat = self._heartbeat, None
        self._probed.clear()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- pause / weights ---------------------------------------------------------------------

    def pause(self) -> None:
        self.gate.close()

    def resume(self) -> None:
        self.gate.open()

    async def drain(self, timeout: float) -> bool:
        """Wait until no call is in flight; False if that took longer than `timeout` s."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def update_weights(self, path: str | None, version: int | None = None,
                             drain_timeout: float = 300.0) -> dict[str, Any]:
        """Pause, drain, load `path` on every instance in rotation with one new version, resume
        (unless the fleet was paused before). Instances that fail to load leave rotation
        until a heartbeat re-syncs them; if none succeeds nothing changes and this raises.

        `path=None` records a version for weights pushed out of band (e.g. vLLM's NCCL
        weight transfer while the fleet was paused): no instance is asked to load anything,
        and instances that do not report versions themselves stamp `version` from now on."""
        if path is None:
            if version is None:
                raise BadRequest("give the new weights' `path`, or the `version` of weights "
                                 "already pushed to the engines", param="path")
            return self._record_version(version)
        async with self._updating:
            was_paused = self.gate.paused
            self.pause()
            try:
                if not await self.drain(drain_timeout):
                    raise Overloaded(f"{self.in_flight} calls still in flight after "
                                     f"{drain_timeout:g} s; retry the weight update later",
                                     retry_after=5)
                target = version if version is not None else self.weight_version + 1
                members = [i for i in self.instances.values() if i.in_rotation]
                if not members:
                    raise BackendUnavailable("no engine instance is in rotation to load "
                                             "weights into; see GET /admin/fleet")
                outcomes = await asyncio.gather(
                    *(i.member.load_weights(path, target) for i in members),
                    return_exceptions=True)
                return self._apply_update(path, target, members, outcomes)
            finally:
                if not was_paused:
                    self.resume()

    def _record_version(self, version: int) -> dict[str, Any]:
        for inst in self.instances.values():
            inst.member.weight_version = version
            inst.weight_version = version
        self.weight_version = version
        self.weights_path = None  # nothing a recovered instance could re-load
        self.metrics.weight_updates.inc()
        return {"weight_version": version, "path": None, "updated": list(self.instances),
                "failed": {}}

    def _apply_update(self, path: str, target: int, members: list[Instance],
                      outcomes: list[int | BaseException]) -> dict[str, Any]:
        failed = {i.name: o for i, o in zip(members, outcomes, strict=True)
                  if isinstance(o, BaseException)}
        for o in failed.values():
            if not isinstance(o, Exception):
                raise o  # cancellation and the like are not load failures
        if len(failed) == len(members):
            first = next(iter(failed.values()))
            if isinstance(first, GatewayError):
                raise type(first)(f"no instance loaded the weights: {first}")
            raise BackendUnavailable(f"no instance loaded the weights: {first!r}")
        for inst, outcome in zip(members, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if inst.take_out(f"weight update to v{target} failed: {outcome}", self.beats):
                    self.metrics.removals.labels(inst.name, "weights").inc()
            else:
                inst.weight_version = int(outcome)
        self.weight_version = target
        self.weights_path = path
        self.metrics.weight_updates.inc()
        return {"weight_version": target, "path": path,
                "updated": [i.name for i in members if i.name not in failed],
                "failed": {name: str(exc) for name, exc in failed.items()}}

    # -- routing -----------------------------------------------------------------------------

    async def _with_retries(self, request: GenerateRequest) -> GenerateResult:
        tried: set[str] = set()
        try:  # the common case, without building a retry loop (~40 µs a call)
            return await self._attempt(request, tried)
        except RETRYABLE:
            if self.retries == 0:
                raise
        # Failed on one instance: retry at once on another, backing off after that.
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries), retry=retry_if_exception(_retryable),
            wait=wait_exponential_jitter(multiplier=0.02, max=0.5), reraise=True)
        async for attempt in retrying:
            with attempt:
                self.metrics.retries.inc()
                return await self._attempt(request, tried)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def _attempt(self, request: GenerateRequest, tried: set[str]) -> GenerateResult:
        inst = self._choose(request.session_id, tried)
        tried.add(inst.name)
        return await self._call(inst, request)

    def _choose(self, session_id: str, tried: set[str]) -> Instance:
        in_rotation = [i for i in self.instances.values() if i.in_rotation]
        if not in_rotation:
            raise BackendUnavailable("no engine instance is in rotation (all failed their "
                                     "health checks); see GET /admin/fleet")
        fresh = [i for i in in_rotation if i.name not in tried] or in_rotation
        return self.placement.pick(session_id, fresh)

    async def _call(self, inst: Instance, request: GenerateRequest) -> GenerateResult:
        inst.in_flight += 1
        inst.calls += 1
        t0 = time.perf_counter()
        try:
            result = await inst.member.generate(request)
        except Overloaded:
            self.metrics.calls.labels(inst.name, "overloaded").inc()
            raise
        except BackendUnavailable as exc:
            self._failed(inst, exc)
            raise
        except BadRequest:
            self.metrics.calls.labels(inst.name, "rejected").inc()
            raise
        finally:
            inst.in_flight -= 1
        ms = (time.perf_counter() - t0) * 1000
        inst.errors_in_a_row = 0
        inst.weight_version = result.weight_version
        inst.record_tokens(len(result.completion_ids))
        result.instance = inst.name
        self.metrics.calls.labels(inst.name, "ok").inc()
        self.metrics.latency_ms.labels(inst.name).observe(ms)
        self.metrics.tokens.labels(inst.name).inc(len(result.completion_ids))
        return result

    def _failed(self, inst: Instance, exc: BackendUnavailable) -> None:
        inst.failures += 1
        inst.errors_in_a_row += 1
        self.metrics.calls.labels(inst.name, "failed").inc()
        if _connection_lost(exc):
            why, label = f"connection lost: {exc.message}", "connection"
        elif inst.errors_in_a_row >= self.heartbeat_misses:
            why, label = f"{inst.errors_in_a_row} failed calls in a row: {exc.message}", "errors"
        else:
            return
        if inst.take_out(why, self.beats):
            self.metrics.removals.labels(inst.name, label).inc()

    def _state(self) -> dict[str, float]:
        return {"paused": float(self.gate.paused), "waiting": float(self.gate.waiting),
                "weight_version": float(self.weight_version)}

    def describe(self) -> dict[str, Any]:
        return {"weight_version": self.weight_version, "weights_path": self.weights_path,
                "paused": self.gate.paused, "waiting": self.gate.waiting,
                "in_flight": self.in_flight, "beats": self.beats,
                "heartbeat_interval": self.heartbeat_interval,
                "session_moves": self.placement.moves,
                "instances": [i.describe() for i in self.instances.values()]}


def fleet_specs(config: GatewayConfig) -> list[UpstreamSpec]:
    """The upstreams a config names (`upstreams` flags, then the `fleet_config` file);
    raises BadRequest with the fix when there are none or one is malformed."""
    # A plain URL gets the configured backend's kind when that one serves upstreams.
    default = config.backend if backend_class(config.backend).remote else "vllm"
    specs = [parse_upstream(u, default) for u in config.upstreams]
    if config.fleet_config:
        specs += load_fleet_file(config.fleet_config)
    if not specs:
        raise BadRequest(f"backend {config.backend!r} needs engines: pass --upstream URL "
                         "(repeatable, e.g. sglang=http://h2:30000) or --fleet-config FILE",
                         param="upstreams")
    check_unique(specs)
    return specs


def build_member(spec: UpstreamSpec, config: GatewayConfig) -> Backend:
    """One fleet member: the backend class the upstream's kind names, built for its URL."""
    try:
        cls = backend_class(spec.kind)
    except ValueError as exc:
        raise BadRequest(f"upstream {spec.instance_name()}: {exc}", param="upstreams") from exc
    if not cls.remote:
        raise BadRequest(f"upstream {spec.instance_name()}: backend {spec.kind!r} runs in the "
                         "gateway's process and takes no URL; use a remote kind such as "
                         "vllm, sglang or openai", param="upstreams")
    return cls.from_config(config, spec)


def make_fleet(config: GatewayConfig) -> Fleet:
    """The fleet a gateway config describes (started by the gateway's lifespan)."""
    members = [build_member(s, config) for s in fleet_specs(config)]
    return Fleet(members, heartbeat_interval=config.heartbeat_interval,
                 heartbeat_timeout=config.heartbeat_timeout,
                 heartbeat_misses=config.heartbeat_misses, retries=config.fleet_retries,
                 pause_wait=config.pause_wait, load_factor=config.sticky_load_factor)
