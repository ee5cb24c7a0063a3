"""`--executor ray`: each rollout (agent plus sandbox) runs as a Ray task on a node that has the
resources it declares; the gateway and the pool stay in the driver, reached over HTTP.

The driver opens the rollout's session (so the pool knows every rollout before it is placed),
the task attaches to it by id and key, runs setup, agent and grading where Ray put it, and
returns what it saw; the driver scores the group and closes the sessions as in-process.

Resources a rollout declares: `num_cpus` = the manifest's sandbox cpus (1 without a sandbox),
`memory` = its memory_mb, and a custom resource named after the sandbox kind for kinds that need
a host service (`{"docker": 1}`: declare it with `ray start --resources '{"docker": 8}'` on the
nodes that run dockerd). A run none of whose nodes can ever satisfy them stops up front (exit 2).

A node lost mid-run (`NodeDiedError`, `WorkerCrashedError`, ...): its rollouts end as
`env_failure` with the Ray error as reason; they are not retried in the run (Ray's own task
retries are off: a retry would write a second attempt's turns into the same session), so each
rollout has exactly one session and one record. `envhub run --resume --out DIR` runs the
env_failure rollouts again, in new sessions.

Environments are loaded on the node by their reference (a built-in name, an installed
`owner/name@version`, or a folder path that exists there too). Sandboxes left by a node that
died are that node's to reap (`envhub sandbox reap` there).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from envhub.envs.environment import Task, Verdict
from envhub.envs.errors import RunConfigError
from envhub.envs.loader import LoadedEnv
from envhub.orchestrator.groups.attached import (
    RemoteRollout,
    attached_rollout,
    post_held_signals,
    with_session,
)
from envhub.orchestrator.groups.plan import RolloutKey
from envhub.orchestrator.groups.rollout import PendingRollout, RolloutSetup
from envhub.orchestrator.groups.scoring import close_session
from envhub.sdk.types import Signal

log = logging.getLogger(__name__)
HOST_SERVICE_KINDS = ("docker",)  # sandbox kinds placed by a custom resource of that name
MIB = 1 << 20


@dataclass
class RemoteResult:
    """What the node saw (pickled back): PendingRollout's fields without the session."""

    status: str
    reason: str | None
    stopped: str | None
    turns: int
    agent_info: dict[str, Any]
    verdict: Verdict | None
    duration_s: float
    setup_s: float
    verify_s: float
    node: dict[str, str] = field(default_factory=dict)
    signals: list[Signal] = field(default_factory=list)  # the agent's, for the driver to post


def rollout_resources(loaded: LoadedEnv, sandbox_kind: str) -> dict[str, Any]:
    """Ray task options for one rollout of this environment."""
    spec = loaded.manifest.sandbox
    if sandbox_kind == "none":
        return {"num_cpus": 1}
    opts: dict[str, Any] = {"num_cpus": spec.cpus, "memory": spec.memory_mb * MIB}
    if sandbox_kind in HOST_SERVICE_KINDS:
        opts["resources"] = {sandbox_kind: 1}
    return opts


class RayExecutor:
    name = "ray"

    def __init__(self) -> None:
        self._owns_ray = False
        self._address = os.environ.get("RAY_ADDRESS") or None
        self._remote: Any = None

    async def start(self) -> None:
        try:
            import ray
        except ImportError:
            raise RunConfigError("--executor ray needs Ray: pip install 'envhub[ray]'") from None
        if not ray.is_initialized():
            if self._address:  # ray.init waits for minutes on an address where nothing listens
                await asyncio.to_thread(_reachable, self._address)
            try:
                # In this thread (Ray installs signal handlers only from the main thread);
                # nothing runs yet that a short block could delay.
                ray.init(address=self._address, logging_level=logging.WARNING,
                         log_to_driver=False, include_dashboard=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                where = f"RAY_ADDRESS={self._address}" if self._address else "a local Ray"
                raise RunConfigError(f"--executor ray: cannot connect to {where}: {e}; start a "
                                     "cluster with `ray start --head` and set RAY_ADDRESS to its "
                                     "address (host:port)") from e
            self._owns_ray = True
        self._remote = ray.remote(max_retries=0, retry_exceptions=False)(run_on_node)

    def gateway_host(self) -> str:
        """Loopback for a cluster on loopback; otherwise this node's address as Ray sees it."""
        host = urlparse(f"ray://{self._address}").hostname if self._address else None
        if host is None or host == "localhost" or _is_loopback(host):
            return "127.0.0.1"
        import ray

        return str(ray.util.get_node_ip_address())

    async def check(self, loaded: LoadedEnv, sandbox_kind: str) -> None:
        import ray

        need = rollout_resources(loaded, sandbox_kind)
        wanted = {"CPU": need["num_cpus"], **need.get("resources", {})}
        if "memory" in need:
            wanted["memory"] = need["memory"]
        nodes = [n for n in await asyncio.to_thread(ray.nodes) if n.get("Alive")]
        if any(all(n.get("Resources", {}).get(r, 0) >= v for r, v in wanted.items())
               for n in nodes):
            return
        shown = ", ".join(f"{r}={v:g}" if r != "memory" else f"memory={v / MIB:g}MiB"
                          for r, v in wanted.items())
        raise RunConfigError(
            f"--executor ray: no node of the cluster has what a rollout of {loaded.name} "
            f"declares ({shown}); start a node with them, e.g. `ray start --address ADDR "
            f"--num-cpus N{_resources_flag(need)}`")

    async def execute(self, key: RolloutKey, group_id: str, loaded: LoadedEnv, task: Task,
                      rs: RolloutSetup) -> PendingRollout:
        import ray

        p = await with_session(key, group_id, rs)
        if p.session is None:
            return p
        kind = "none" if loaded.manifest.sandbox.kind == "none" else rs.sandbox_kind
        job = RemoteRollout(
            key=key, group_id=group_id, env_ref=_node_ref(loaded), task=task,
            run_id=rs.run_id, agent=rs.agent_name, agent_install=rs.agent_install,
            agent_on_host=rs.agent_on_host, sandbox_kind=kind,
            agent_kind=rs.agent_kind, model=rs.model, limits_override=rs.limits_override,
            gateway_url=rs.link.url, session_id=str(p.session.id),
            api_key=str(p.session.api_key))
        ref = self._remote.options(**rollout_resources(loaded, kind)).remote(job)
        try:
            result: RemoteResult = await ref
        except asyncio.CancelledError:  # interrupted: stop the task, end its session unscored
            ray.cancel(ref, force=True)
            await asyncio.shield(close_session(p.session, "env_failure", "interrupted"))
            raise
        except ray.exceptions.RayTaskError as e:  # our code raised on the node: a runner bug
            cause = e.cause if isinstance(e.cause, BaseException) else e
            return p.fail("env_failure", f"runner on a Ray node: {type(cause).__name__}: "
                          f"{_first_line(cause)}")
        except ray.exceptions.RayError as e:  # the node or its worker is gone
            return p.fail("env_failure", f"ray: rollout lost with its node or worker "
                          f"({type(e).__name__}): {_first_line(e)}")
        p.status, p.reason, p.stopped, p.turns = (result.status, result.reason, result.stopped,
                                                  result.turns)
        p.agent_info, p.verdict = result.agent_info, result.verdict
        p.duration_s, p.setup_s, p.verify_s = result.duration_s, result.setup_s, result.verify_s
        p.node = result.node
        return await post_held_signals(p, result.signals)

    async def close(self) -> None:
        if self._owns_ray:
            import ray

            self._owns_ray = False
            await asyncio.to_thread(ray.shutdown)


def run_on_node(job: RemoteRollout) -> RemoteResult:
    """The Ray task: one rollout on this node, attached to the driver's session."""
    return asyncio.run(_run_on_node(job))


async def _run_on_node(job: RemoteRollout) -> RemoteResult:
    import ray

    from envhub.envs.agents import agent_for, make_agent

    loaded = _load(job.env_ref)
    # the driver resolved the environment's agent already; resolved again, the same way, for
    # a job that names none
    agent = make_agent(agent_for(job.agent, loaded.env, loaded.name), job.agent_install,
                       job.agent_on_host)
    p = await attached_rollout(job, loaded, agent)
    ctx = ray.get_runtime_context()
    node = {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
            "resources": ",".join(sorted(_custom_resources(ctx)))}
    return RemoteResult(p.status, p.reason, p.stopped, p.turns, p.agent_info, p.verdict,
                        p.duration_s, p.setup_s, p.verify_s, node, p.signals)


@functools.cache
def _load(ref: str) -> LoadedEnv:
    from envhub.orchestrator.catalog import load_env

    return load_env(ref)


def _custom_resources(ctx: Any) -> list[str]:
    """The node's custom resources (node_a, docker, ...), to tell nodes apart in records."""
    import ray

    node_id = ctx.get_node_id()
    for n in ray.nodes():
        if n.get("NodeID") == node_id:
            return [r for r in n.get("Resources", {})
                    if r not in ("CPU", "GPU", "memory", "object_store_memory")
                    and not r.startswith(("node:", "accelerator_type:"))]
    return []


def _node_ref(loaded: LoadedEnv) -> str:
    """The reference a node loads the environment by: a local folder as an absolute path (the
    node's working directory is not ours), anything else as given."""
    path = Path(loaded.ref).expanduser()
    return str(path.resolve()) if path.exists() else loaded.ref


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """RunConfigError (with the fix) unless something accepts connections at RAY_ADDRESS
    (host:port of the head, or ray://host:port of a Ray client server; `auto` and `local` have
    no port and are Ray's to resolve)."""
    import socket

    try:
        parsed = urlparse(address if "://" in address else f"ray://{address}")
        if parsed.port is None:
            return
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port),
                                      timeout=timeout_s):
            return
    except (OSError, ValueError) as e:
        raise RunConfigError(
            f"--executor ray: cannot connect to RAY_ADDRESS={address}: {e}; start a cluster "
            "with `ray start --head` and set RAY_ADDRESS to its address (host:port)") from e


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _resources_flag(need: dict[str, Any]) -> str:
    import json

    extra = need.get("resources")
    return f" --resources '{json.dumps(extra)}'" if extra else ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:500]
