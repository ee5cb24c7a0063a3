"""`audit(AuditConfig)`: run the battery against one environment through the runner (one
`envhub run` per cheat and sandbox kind, the same group machinery), then judge the rows.

Each cheat's run keeps its folder under the audit's `out` (`<kind>-<cheat>/`), so every row can
be read rollout by rollout afterwards. The no-op runs first and alone (it also warms the agent
bundle and image layers the others share); the rest run `parallel` at a time, each within
`cheat_timeout_s` (a run past it is cancelled, its sandboxes reaped, and its row flagged hung).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from envhub.envs.agents import OwnAgent
from envhub.envs.agents.toolbox import Toolbox
from envhub.envs.errors import RunConfigError
from envhub.envs.loader import LoadedEnv
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.kinds import NONE
from envhub.orchestrator.audit.battery import NOOP, ORACLE, Cheat, battery
from envhub.orchestrator.audit.report import AuditRow, judge, row_from_records
from envhub.orchestrator.catalog import load_env
from envhub.orchestrator.groups import EnvChoice, RunConfig, run
from envhub.orchestrator.groups.setup import sandbox_kind

INSTALL_MARKER = ".envhub-install.json"  # registry/install.py writes it into installed folders


@dataclass
class AuditConfig:
    env: str  # built-in name, folder or owner/name@version (as `envhub run` takes it)
    out: Path  # one run folder per row under it
    tasks: int = 2  # the first N tasks
    sandboxes: list[str | None] = field(default_factory=lambda: [None])  # None: the manifest's
    cheats: list[str] = field(default_factory=list)  # only these (empty: all)
    parallel: int = 2  # cheat runs in flight after the no-op
    cheat_timeout_s: float = 900.0


@dataclass
class AuditReport:
    env: str
    version: str
    digest: str | None
    rows: list[AuditRow]
    wall_s: float


@dataclass
class _Job:
    cheat: Cheat
    kind: str
    config: RunConfig


def load_target(ref: str) -> tuple[LoadedEnv, Cheat, list[Cheat]]:
    """The environment and its battery (controls first). Raises the loader's errors (exit 2)."""
    loaded = load_env(ref)
    tasks = loaded.env.load_tasks()
    if not tasks:
        raise RunConfigError(f"{ref}: the environment has no tasks to audit")
    # the schemas the tool-calling agent offers the model (the env's own, then shared tools);
    # the toolbox only keeps the sandbox for later calls, and none is made here
    schemas = Toolbox(loaded.env, tasks[0], cast(Sandbox, None)).schemas
    own = loaded.env.default_agent if isinstance(loaded.env, OwnAgent) else None
    cheats = battery(loaded.manifest.sandbox.kind != NONE, schemas, own)
    return loaded, cheats[0], cheats


def package_digest(loaded: LoadedEnv) -> str | None:
    """The registry digest of an installed package, or of the package `envhub publish` would
    pack from a folder (so `envhub publish --audit` can match it); None for built-ins and
    folders that cannot be packed."""
    try:
        return str(json.loads((loaded.folder / INSTALL_MARKER).read_text())["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    import tempfile

    from envhub.envs import builtin
    from envhub.registry.archive import pack
    from envhub.registry.errors import RegistryError

    if Path(builtin.__file__).parent.resolve() in loaded.folder.resolve().parents:
        return None

    try:
        with tempfile.TemporaryDirectory(prefix="envhub-audit-pack-") as tmp:
            return pack(loaded.folder, tmp).digest
    except (RegistryError, OSError, ValueError):  # e.g. a folder holding a symlink
        return None


def plan_jobs(config: AuditConfig, loaded: LoadedEnv, cheats: list[Cheat]) -> list[_Job]:
    """One run per (sandbox kind, cheat); RunConfigError/ValidationError/SandboxUnavailable
    (exit 2) before anything starts."""
    known = {c.name for c in cheats}
    unknown = sorted(set(config.cheats) - known)
    if unknown:
        raise RunConfigError(f"--cheat {', '.join(unknown)}: not in this environment's battery "
                             f"({', '.join(sorted(known))})")
    # the controls always run: every verdict is relative to the no-op, and an oracle that
    # fails says the environment (not the cheats) is broken
    wanted = [c for c in cheats if not config.cheats or c.name in (*config.cheats, NOOP, ORACLE)]
    # a kind given twice (or auto and what it picks) runs once
    kinds = dict.fromkeys(sandbox_kind(s, loaded) for s in config.sandboxes)
    jobs = []
    for kind in kinds:
        for cheat in wanted:
            folder = config.out / f"{kind}-{cheat.name}"
            model = _script_file(cheat, folder, config.tasks) if cheat.scripted else "zero"
            jobs.append(_Job(cheat, kind, RunConfig(
                envs=[EnvChoice(ref=config.env)], agent=cheat.agent, model=model,
                max_turns=_turns(cheat) if cheat.scripted else None,
                sandbox=None if kind == NONE else kind, n=config.tasks, k=1,
                # scripted texts are answered in order: one rollout at a time keeps each
                # rollout on its own texts
                concurrency=1 if cheat.scripted else min(config.tasks, 4),
                out=folder / "run")))
    return jobs


def _turns(cheat: Cheat) -> int:
    """A scripted cheat's turn limit: its texts and one more (the agent nudges a reply without a
    tool call while a submit tool exists, so a rollout may use every turn it has)."""
    return len(cheat.texts) + 1


def _script_file(cheat: Cheat, folder: Path, tasks: int) -> str:
    """`scripted:FILE`: the cheat's texts, cycled to cover every turn of `tasks` rollouts run
    one after another. A rollout that ends early (its submit succeeded) leaves the rest to the
    next one, which then starts mid-cycle: still the same cheat's hostile texts."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "script.json"
    need = tasks * _turns(cheat)
    texts = [cheat.texts[i % len(cheat.texts)] for i in range(need)]
    path.write_text(json.dumps(texts), encoding="utf-8")
    return f"scripted:{path}"


async def audit(config: AuditConfig, on_row: Callable[[AuditRow], None] | None = None
                ) -> AuditReport:
    """Run the battery; rows in battery order, judged. Bad input raises before any run."""
    started = time.monotonic()
    loaded, _noop, cheats = await asyncio.to_thread(load_target, config.env)
    jobs = plan_jobs(config, loaded, cheats)
    rows: dict[int, AuditRow] = {}

    async def one(i: int, job: _Job) -> None:
        rows[i] = await _run_job(job, config.cheat_timeout_s)
        if on_row is not None:
            on_row(rows[i])

    first = [i for i, j in enumerate(jobs) if j.cheat.name == NOOP]
    for i in first:
        await one(i, jobs[i])
    gate = asyncio.Semaphore(max(1, config.parallel))
    # Scripted cheats one at a time: their gateways share this process, and rendering a 1 MB
    # scripted text holds it for seconds, which another run's gateway would see as a stall.
    scripted_lane = asyncio.Semaphore(1)

    async def gated(i: int, job: _Job) -> None:
        if not job.cheat.scripted:
            async with gate:
                await one(i, job)
            return
        async with scripted_lane, gate:  # the lane first: a waiting job holds no slot
            await one(i, job)

    await asyncio.gather(*(gated(i, j) for i, j in enumerate(jobs) if i not in first))
    ordered = judge([rows[i] for i in range(len(jobs))])
    return AuditReport(loaded.name, loaded.manifest.version, package_digest(loaded), ordered,
                       time.monotonic() - started)


async def _run_job(job: _Job, timeout_s: float) -> AuditRow:
    started = time.monotonic()
    out = str(job.config.out)
    try:
        outcome = await asyncio.wait_for(run(job.config, progress=False), timeout_s)
    except TimeoutError:
        return AuditRow(cheat=job.cheat.name, what=job.cheat.what, sandbox=job.kind,
                        timed_out=True, wall_s=time.monotonic() - started, out=out)
    except Exception as e:  # noqa: BLE001 - a cheat that breaks the run is a finding, not a crash
        return AuditRow(cheat=job.cheat.name, what=job.cheat.what, sandbox=job.kind,
                        error=f"{type(e).__name__}: {e}"[:500],
                        wall_s=time.monotonic() - started, out=out)
    row = row_from_records(job.cheat.name, job.cheat.what, job.kind, outcome.records)
    row.wall_s, row.out = time.monotonic() - started, out
    return row
