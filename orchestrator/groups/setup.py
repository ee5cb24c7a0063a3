"""What a run sets up before its groups and takes down after them, shared by `envhub run`
(run.py: every group planned up front) and the group runner of `envhub train` (stream.py:
groups on request): environments loaded with their sandbox kinds, the agent prepared, a
scratch folder owned by this process, one RolloutSetup per environment, and the reaping of
anything still labelled with the run id."""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from envhub.envs.errors import RunConfigError
from envhub.envs.loader import LoadedEnv, check_tools
from envhub.envs.sandbox import best_available, reap
from envhub.envs.sandbox.kinds import AUTO, NONE, check_kind, check_supported, effective_kind
from envhub.envs.sandbox.reaper import owner_alive, owner_label
from envhub.orchestrator.catalog import load_env
from envhub.orchestrator.groups.rollout import RolloutSetup

log = logging.getLogger(__name__)
OWNER_FILE = ".envhub-owner"  # "<host>:<pid>" of the run that owns a scratch folder


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (as Ray and nginx do):
    a rollout in flight holds several sockets (its session, its agent's client, both ends when
    the gateway is in-process) and 896 rollouts at once held 7,643 descriptors, past the usual
    soft limit of 1,024. Returns the limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a container's cap below the hard limit: keep soft
            pass
    return soft


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


def sandbox_kind(sandbox: str | None, loaded: LoadedEnv) -> str:
    """--sandbox, else the manifest's choice; `auto` becomes the best backend available.
    Raises SandboxUnavailable (with the fix) when the environment cannot run in it here."""
    if sandbox is not None:  # checked also for an environment that needs no sandbox
        try:
            check_kind(sandbox)
        except ValueError as e:
            raise RunConfigError(f"--sandbox: {e}") from None
    spec = loaded.manifest.sandbox
    if spec.kind == NONE:
        return NONE
    kind = sandbox or spec.kind
    check_supported(loaded.name, spec.supported_kinds, effective_kind(kind))
    return best_available() if kind == AUTO else kind


def load_envs(refs: list[str], sandbox: str | None = None,
              served: dict[str, LoadedEnv] | None = None
              ) -> tuple[dict[str, LoadedEnv], dict[str, str]]:
    """Each environment loaded (tools checked against its tasks) and the sandbox kind its
    rollouts use (`sandbox`, else its manifest's); raises the loader's errors (with the fix).
    `served`: environments of task services by reference, described already."""
    loaded = {}
    for ref in refs:
        le = (served or {}).get(ref) or load_env(ref)
        check_tools(le, le.env.load_tasks())
        loaded[ref] = le
    return loaded, {ref: sandbox_kind(sandbox, le) for ref, le in loaded.items()}


async def prepare_agent(agent: Any, sandbox: str | None, kinds: dict[str, str]
                        ) -> dict[str, str]:
    """For an in-sandbox agent: the kind it runs in per environment (an environment without a
    sandbox gets `sandbox` (--sandbox), else the best available kind, for the agent alone),
    each checked and its bundle built before anything starts (AgentSpecError, exit 2,
    otherwise)."""
    if not getattr(agent, "in_sandbox", False):
        return {}
    chosen = {}
    for name, kind in kinds.items():
        if kind == NONE:
            kind = sandbox or AUTO
            kind = best_available() if kind == AUTO else kind
        if effective_kind(kind) not in ("docker", "local"):
            kind = effective_kind(kind)
        chosen[name] = kind
    for kind in set(chosen.values()):
        await agent.prepare(kind)
    return chosen


def sweep_stale_scratch() -> None:
    """Remove scratch folders of earlier runs on this machine whose process died without
    cleaning up (SIGKILL, power loss). Folders without an owner file are left alone: their run
    may be starting right now."""
    for folder in Path(tempfile.gettempdir()).glob("envhub-run-*"):
        try:
            owner = (folder / OWNER_FILE).read_text().strip()
        except OSError:
            continue
        if not owner_alive(owner):
            shutil.rmtree(folder, ignore_errors=True)


def open_scratch(run_id: str, sweep: bool = False) -> Path:
    """A new scratch folder (command agents' working folders) owned by this process: if the
    process dies without removing it, the next run on this machine sweeps it away. `sweep`:
    first remove those of dead runs (`sweep_stale_scratch`), as a run's driver does."""
    if sweep:
        sweep_stale_scratch()
    scratch = Path(tempfile.mkdtemp(prefix=f"envhub-{run_id}-"))
    (scratch / OWNER_FILE).write_text(owner_label())
    return scratch


def rollout_setups(run_id: str, agent: Any, agent_name: str, link: Any, kinds: dict[str, str],
                   agent_kinds: dict[str, str], scratch: Path, max_turns: int | None,
                   time_limit_s: float | None, agent_install: list[str] | None,
                   agent_on_host: bool, metrics: Any = None) -> dict[str, RolloutSetup]:
    """One RolloutSetup per environment (keys of `kinds`). Agents ask for "default": every
    envhub gateway serves its one model under that name (besides its own), whichever --model
    chose it."""
    overrides = {k: v for k, v in (("max_turns", max_turns),
                                   ("time_limit_s", time_limit_s)) if v is not None}
    return {name: RolloutSetup(run_id=run_id, agent=agent, agent_name=agent_name, link=link,
                               sandbox_kind=kind, scratch=scratch, model="default",
                               limits_override=overrides, agent_kind=agent_kinds.get(name),
                               agent_install=list(agent_install or []),
                               agent_on_host=agent_on_host, metrics=metrics)
            for name, kind in kinds.items()}


async def take_down(run_id: str, kinds: set[str], scratch: Path) -> None:
    """Remove any sandbox of this run's kinds still labelled with it (a crashed close, an
    interruption), then the scratch folder."""
    kinds = kinds - {NONE}
    if kinds:
        try:
            await asyncio.to_thread(reap, run_id, False, kinds)
        # reaping is a safety net: every sandbox was closed already
        except Exception as e:  # noqa: BLE001
            log.warning("reaping sandboxes of %s failed: %s", run_id, e)
    shutil.rmtree(scratch, ignore_errors=True)
