"""Heartbeats: probe every instance each interval; drain the dead, re-admit the recovered.

A beat is missed when the probe fails or takes longer than `heartbeat_timeout`. After
`heartbeat_misses` misses in a row the instance leaves rotation. It comes back after as many
answered beats in a row (one at startup) — so an instance that answers /health but fails its
calls does not flap in and out every beat — and only once its weights match the fleet's: an
instance that missed a weight update (it was down, or restarted with its initial weights) is
sent the fleet's last weights first. Once the fleet pushed weights by path (and told every
engine their version), the engine's own report decides — vLLM's /health is empty, so its
/weight_info is asked — never the version the gateway last stamped: a restarted engine
reports its start-up version, leaves rotation (`envhub_fleet_removals{why="version"}`, a
warning in the log) and is re-loaded before it serves again. After a version recorded for
weights pushed out of band there is nothing to re-load and engines need not know the version,
so their reports are not compared.

Late is not dead. A beat answered late (the probe timed out: the engine is slow, e.g. under
overload) counts as a miss, but it never takes out the *last* instance in rotation: with
every engine out, every call would get a 503, while a slow engine still serves them. An
instance that truly fails — connection refused or reset, an error answer — leaves rotation
after its misses even if it is the last one (then calls get a clear 503). Calls that fail on
the kept instance still drain it through the router's errors-in-a-row rule.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import httpx

from envhub.gateway.backends.vllm import TransportTimeout
from envhub.gateway.fleet.instance import Instance

if TYPE_CHECKING:
    from envhub.gateway.router import Fleet

log = logging.getLogger("envhub.gateway.fleet")


async def beat_forever(fleet: Fleet) -> None:
    while True:
        await asyncio.sleep(fleet.heartbeat_interval)
        await probe_all(fleet)


async def probe_all(fleet: Fleet) -> None:
    await asyncio.gather(*(probe(fleet, i) for i in fleet.instances.values()))
    if fleet.weights_path is None:
        # No update pushed yet: the fleet is at the newest version an instance reports.
        versions = [i.weight_version for i in fleet.instances.values() if i.in_rotation]
        if versions:
            fleet.weight_version = max(versions)
    fleet.beats += 1


async def probe(fleet: Fleet, inst: Instance) -> None:
    try:
        info = await asyncio.wait_for(inst.member.health(), fleet.heartbeat_timeout)
    except (Exception, TimeoutError) as exc:  # noqa: BLE001 - any failure to answer is a miss
        _missed(fleet, inst, exc)
        return
    inst.misses = 0
    inst.good_beats += 1
    version = _version(info, inst.weight_version)
    if fleet.weights_path is not None:
        # the fleet pushed its weights by path and told every engine their version, so the
        # engine's own report is the truth: after a restart it is the start-up version
        version = _version({"weight_version": info.get("engine_weight_version")}, version) \
            if isinstance(info, dict) else version
    inst.weight_version = version
    if fleet.weights_path is not None and version != fleet.weight_version:
        if fleet._updating.locked():
            return  # the update in progress decides about this instance
        why = f"weight version {version}, fleet at {fleet.weight_version}: re-loading"
        if inst.take_out(why, fleet.beats):
            fleet.metrics.removals.labels(inst.name, "version").inc()
            log.warning("instance %s left rotation: %s", inst.name, why)
        if not await _resync(fleet, inst):
            return
    if inst.in_rotation:
        return
    returning = inst.removed_at_beat is not None
    if returning and inst.good_beats < fleet.heartbeat_misses:
        inst.reason = f"recovering: {inst.good_beats} good beat(s) of {fleet.heartbeat_misses}"
        return
    if not fleet._updating.locked():
        if inst.put_in(fleet.beats) and returning:
            log.warning("instance %s is back in rotation", inst.name)


def _late(exc: BaseException) -> bool:
    """The probe ran out of time (ours or the client's), as opposed to failing outright."""
    return isinstance(exc, TimeoutError) or isinstance(
        exc.__cause__, (TimeoutError, httpx.TimeoutException, TransportTimeout))


def _missed(fleet: Fleet, inst: Instance, exc: BaseException) -> None:
    inst.misses += 1
    inst.good_beats = 0
    why = f"missed {inst.misses} heartbeat(s): {exc!r}"
    if inst.misses >= fleet.heartbeat_misses and inst.in_rotation and _late(exc) and not any(
            i.in_rotation for i in fleet.instances.values() if i is not inst):
        # slow but (probably) alive, and nobody else to serve: keep it (module docstring)
        inst.reason = f"kept in rotation as the last instance: {why}"
        fleet.metrics.kept_late.labels(inst.name).inc()
        log.warning("instance %s answers heartbeats late but is the last in rotation; kept: %s",
                    inst.name, why)
        return
    if inst.misses >= fleet.heartbeat_misses:
        if inst.take_out(why, fleet.beats):
            fleet.metrics.removals.labels(inst.name, "heartbeat").inc()
            log.warning("instance %s left rotation: %s", inst.name, why)
    elif not inst.in_rotation:
        inst.reason = why


async def _resync(fleet: Fleet, inst: Instance) -> bool:
    """Load the fleet's weights on a recovered instance; True when it now matches."""
    assert fleet.weights_path is not None
    try:
        inst.weight_version = await inst.member.load_weights(fleet.weights_path,
                                                             fleet.weight_version)
    except Exception as exc:  # noqa: BLE001 - stays out of rotation; the next beat retries
        inst.reason = f"re-loading weights v{fleet.weight_version} failed: {exc}"
        return False
    return inst.weight_version == fleet.weight_version


def _version(info: Any, default: int) -> int:
    """The instance's weight version from its health answer; SGLang reports strings
    ("default" until a versioned update), which keep the last known number."""
    raw = info.get("weight_version") if isinstance(info, dict) else None
    if isinstance(raw, bool):
        return default
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw)
    return default
