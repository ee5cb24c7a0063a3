"""A verifiers (Prime Intellect, 0.4 `verifiers.v1`) taskset run as an envhub environment.

Agent and grading are split the way envhub's contract wants them:
* the agent phase is verifiers' own harness (`rollout`, envs/verifiers/agent.py is the `vf`
  agent): a worker process runs the episode with the seat's harness, whose model client is
  pointed at the rollout's gateway session, so every model call is recorded token-exact; the
  task's scoring is deferred. The episode record (verifiers' trace, built by its interception
  server from the model calls, never by the model) is written to this rollout's host-side
  scratch, and its digest kept here;
* `verify` scores that record in a fresh worker process with the task as the taskset's copy
  (taken when its tasks were loaded: snapshot.py) loads it again, by the task's own
  `@vf.reward`/`@vf.metric` functions. The weighted sum
  is the outcome, clamped into [0, 1]; each named reward is in `info`.
A rollout without a record (an agent other than `vf`), or whose record changed after the
harness wrote it, scores 0 with an `ungradable_output` signal. An error the model can cause (a
task hook such as finalize or @stop that parses its answer: TaskError/EnvError; the chat
program: HarnessError; a reward function raising) scores 0 with that signal too, unless the
control says otherwise: the task's gold answer (the oracle) run and scored the same way, once
per task; when the gold answer fails the same way, the environment is broken: env_failure.
A worker that crashes or hangs is env_failure, and so is any other episode error (sandbox,
interception, a model call the gateway failed with 5xx), not a model call it refused (4xx).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from envhub.envs.environment import UNGRADABLE, EnvFailure, RunContext, Task, Verdict
from envhub.envs.errors import EnvLoadError
from envhub.envs.manifest import AgentLimits, Manifest
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.verifiers import process, snapshot
from envhub.sdk.types import Signal

EPISODE_FILE = "verifiers-episode.json"
MAX_EPISODE_BYTES = 64 << 20
TASKS_TIMEOUT_S = 600.0
SCORE_TIMEOUT_S = 300.0
# errors of code that reads what the model wrote (task hooks, the chat program): the model's
# doing unless the gold answer fails the same way (the control); "reward": a reward raised
SUSPECT = ("TaskError", "EnvError", "HarnessError")
REWARD_RAISED = "reward"


def ungradable(reason: str, **info: Any) -> Verdict:
    return Verdict(0.0, False, {"ungradable": reason, **info},
                   signals=[Signal(name=UNGRADABLE, info={"error": reason})])


class VerifiersEnv:
    """Entrypoint of a verifiers environment: `[metadata] verifiers` in the manifest names the
    taskset (a module file or package folder in the package, or an installed taskset id)."""

    # envhub.envs.agents.OwnAgent: their harness is the agent (the `vf` agent); the oracle
    # answers through it; envhub's tool-calling agent would have nothing to act on
    default_agent = "vf"
    agents = ("vf", "oracle")

    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder, self.manifest = folder, manifest
        ref = str(manifest.metadata.get("verifiers") or "")
        if not ref:
            raise EnvLoadError(f"{folder}/envhub.toml: [metadata] verifiers is missing: give the "
                               "taskset module (e.g. verifiers = \"my_tasks.py\")")
        local = folder / ref
        self.ref = str(local.resolve()) if local.exists() else ref
        self._tasks: list[Task] | None = None
        self._source: snapshot.Snapshot | None = None  # the copy everything runs from
        self.harnesses: dict[str, str] = {}
        self._written: dict[str, str] = {}  # episode file -> sha256 of what the harness wrote
        self._suspect: dict[str, list[dict[str, Any]]] = {}  # episode file -> errors to control
        # task key -> how its gold answer fails (kinds of SUSPECT / REWARD_RAISED), None: no
        # gold answer to run; one control per task, shared by the samples that need it
        self._controls: dict[str, set[str] | None] = {}
        self._control_locks: dict[str, asyncio.Lock] = {}

    # -- the Environment protocol ------------------------------------------------------------

    def load_tasks(self) -> list[Task]:
        if self._tasks is None:
            try:
                self._source = snapshot.take(self.ref, self)
            except (OSError, ValueError) as e:
                raise EnvLoadError(f"verifiers environment {self.ref}: copying its source: "
                                   f"{e}") from None
            try:
                reply = process.call(["tasks", self._source.ref], TASKS_TIMEOUT_S,
                                     cwd=self.folder, env=self._worker_env())
            except process.WorkerFailed as e:
                raise EnvLoadError(f"verifiers environment {self.ref}: {e}") from None
            if reply.code != 0:
                raise EnvLoadError(f"verifiers environment {self.ref}: "
                                   f"{reply.body.get('error')}\n{reply.stderr}")
            self.harnesses = dict(reply.body.get("harnesses") or {})
            self._tasks = _tasks(reply.body.get("tasks") or [])
        return self._tasks

    def _worker_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        src = self._source
        path = {"ENVHUB_VF_PATH": json.dumps(src.path)} if src is not None else {}
        return {**path, **(extra or {})}

    def _ref(self) -> str:
        if self._source is None:
            self.load_tasks()
        assert self._source is not None
        return self._source.ref

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        return await ctx.open_sandbox(self.manifest.sandbox)

    def tools(self, task: Task) -> list[str]:
        return []  # the harness brings the task's tools (its MCP toolsets), not envhub

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        """The oracle: verifiers' harness answered by a stand-in model that replies the task's
        reference answer (its `answer` field), graded like any rollout."""
        await self.rollout(task, ctx, None, self.manifest.agent)

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        path = ctx.scratch / EPISODE_FILE
        suspect = self._suspect.pop(str(path), [])
        if not path.is_file():
            return ungradable("no verifiers episode: the rollout did not run verifiers' harness "
                              "(run with --agent vf)")
        with path.open("rb") as f:
            data = f.read(MAX_EPISODE_BYTES + 1)
        if len(data) > MAX_EPISODE_BYTES:
            return ungradable(f"verifiers episode over {MAX_EPISODE_BYTES} bytes")
        if self._written.pop(str(path), None) != hashlib.sha256(data).hexdigest():
            return ungradable("the verifiers episode is not the one the harness wrote")
        if suspect:
            error = suspect[0]
            return await self._controlled(task, str(error.get("type")),
                                          f"verifiers episode: {error.get('type')}: "
                                          f"{str(error.get('message'))[:2000]}")
        body = await self._score(task, path)
        if body.get("error"):
            return await self._controlled(task, REWARD_RAISED,
                                          f"verifiers rewards: {str(body['error'])[:2000]}")
        return _verdict(body)

    async def _score(self, task: Task, path: Path) -> dict[str, Any]:
        """The task's rewards on the episode at `path`, computed from the taskset's copy;
        raises EnvFailure when the worker or the copy failed."""
        if self._source is not None and not snapshot.intact(self._source):
            raise EnvFailure("the taskset's copy changed since its tasks were loaded")
        try:
            reply = await process.acall(["score", self._ref(), task.data["key"], str(path)],
                                        SCORE_TIMEOUT_S, cwd=self.folder, env=self._worker_env())
        except process.WorkerFailed as e:
            raise EnvFailure(str(e)) from None
        if reply.code != 0:
            raise EnvFailure(f"verifiers score: {reply.body.get('error')}")
        return dict(reply.body)

    async def _controlled(self, task: Task, kind: str, reason: str) -> Verdict:
        """An error of `kind` the model may have caused: 0 with a signal, unless the task's gold
        answer fails the same way (then the environment is broken: env_failure)."""
        control = await self.control(task)
        if control is not None and kind in control:
            return Verdict(0.0, False, env_failure=f"{reason} (the task's gold answer fails the "
                                                   "same way: the environment is broken)")
        return ungradable(reason, control="no gold answer to compare with" if control is None
                          else "the task's gold answer passes")

    async def control(self, task: Task) -> set[str] | None:
        """How the task's gold answer fails through the harness and its rewards: the kinds of
        SUSPECT errors its episode records, plus REWARD_RAISED when a reward raises on it;
        None when the task has no gold answer. Run once per task (cached); EnvFailure when the
        control itself cannot run."""
        key = str(task.data["key"])
        async with self._control_locks.setdefault(key, asyncio.Lock()):
            if key not in self._controls:
                self._controls[key] = await self._run_control(task)
        return self._controls[key]

    async def _run_control(self, task: Task) -> set[str] | None:
        limits = self.manifest.agent
        with tempfile.TemporaryDirectory(prefix="envhub-vf-control-") as tmp:
            path = Path(tmp) / EPISODE_FILE
            # controlled: the gold answer's hook errors are the control's finding, not raised
            summary = await self._episode(task, path, None, limits, controlled=True)
            self._written.pop(str(path), None)
            self._suspect.pop(str(path), None)
            if summary is None:
                return None
            kinds = {str(e.get("type")) for e in summary.get("errors", [])} & set(SUSPECT)
            if not kinds and (await self._score(task, path)).get("error"):
                kinds.add(REWARD_RAISED)
            return kinds

    # -- the harness (the `vf` agent and the oracle) -----------------------------------------

    async def rollout(self, task: Task, ctx: RunContext, session: tuple[str, str, str] | None,
                      limits: AgentLimits) -> dict[str, Any]:
        """One episode of verifiers' harness on `task`; `session` = (base URL with /v1, key,
        model), None for the oracle's stand-in model. Returns the worker's summary; raises
        EnvFailure when verifiers' machinery failed. Errors the model may have caused are kept
        for `verify` to weigh against the control."""
        path = ctx.scratch / EPISODE_FILE
        summary = await self._episode(task, path, session, limits, controlled=session is not None)
        if summary is None:
            raise EnvFailure(f"task {task.id} has no reference answer (an `answer` field) for "
                             "the oracle")
        return summary

    async def _episode(self, task: Task, path: Path, session: tuple[str, str, str] | None,
                       limits: AgentLimits, controlled: bool) -> dict[str, Any] | None:
        """Run one episode into `path` (see `rollout`); None when the oracle was asked for and
        the task has no gold answer. `controlled`: SUSPECT errors are kept for `verify` (the
        model's episodes); otherwise they are the environment's (the gold answer's)."""
        path.unlink(missing_ok=True)
        env = {"ENVHUB_VF_LIMITS": json.dumps(limits.model_dump(mode="json"))}
        if session is None:
            env["ENVHUB_VF_ORACLE"] = "1"
        else:
            env.update(ENVHUB_VF_BASE_URL=session[0], ENVHUB_VF_API_KEY=session[1],
                       ENVHUB_VF_MODEL=session[2])
        try:
            reply = await process.acall(["rollout", self._ref(), task.data["key"], str(path)],
                                        limits.time_limit_s + 120, cwd=self.folder,
                                        env=self._worker_env(env))
        except process.WorkerFailed as e:
            raise EnvFailure(str(e)) from None
        if session is None and reply.code == process.EXIT_INPUT and reply.body.get("no_answer"):
            return None
        if reply.code != 0:
            raise EnvFailure(f"verifiers rollout: {reply.body.get('error')}: {reply.stderr}")
        errors = list(reply.body.get("errors", []))
        infra = [e for e in errors if _infra(e, controlled)]
        if infra:
            raise EnvFailure(f"verifiers harness: {infra[0].get('type')}: "
                             f"{str(infra[0].get('message'))[:1000]}")
        try:
            self._written[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as e:
            raise EnvFailure(f"verifiers rollout wrote no episode: {e}") from None
        suspect = [e for e in errors if e.get("type") in SUSPECT]
        if controlled and suspect:
            self._suspect[str(path)] = suspect
        return dict(reply.body)


def _infra(error: dict[str, Any], controlled: bool) -> bool:
    """Whether an error of the episode is infrastructure's outright: every boundary verifiers
    attributes errors to (harness install, sandbox, interception, toolset) is, but a model call
    the gateway refused (4xx: e.g. over the session's limits), which is the model's doing and
    is graded as it stands, and, in the model's episodes (`controlled`), code that reads what
    the model wrote (SUSPECT), which the control decides."""
    if error.get("type") == "ProviderError":
        status = error.get("status_code")
        return status is None or int(status) >= 500
    return not (controlled and error.get("type") in SUSPECT)


def _tasks(rows: list[dict[str, Any]]) -> list[Task]:
    tasks, seen = [], set()
    for row in rows:
        name = str(row.get("id") or row.get("name") or f"task-{row.get('idx')}")
        if name in seen:
            name = f"{name}-{row.get('idx')}"
        seen.add(name)
        tasks.append(Task(id=name, instruction=str(row.get("prompt") or ""),
                          data={"key": str(row["key"]), "idx": row.get("idx"),
                                "vf_id": row.get("id"), "vf_name": row.get("name")}))
    return tasks


def _verdict(body: dict[str, Any]) -> Verdict:
    """The rubric's weighted sum, clamped into [0, 1], as the outcome; a reward function that
    raised (with the control passing: see `_controlled`) scores 0 with a signal."""
    if body.get("error"):
        return ungradable(f"verifiers rewards: {str(body['error'])[:2000]}")
    raw = body.get("reward")
    if not isinstance(raw, int | float) or not math.isfinite(raw):
        return ungradable(f"verifiers reward is not a finite number: {raw!r}")
    outcome = min(1.0, max(0.0, float(raw)))
    rewards = {str(k): v for k, v in dict(body.get("rewards") or {}).items()}
    info = {"verifiers_reward": float(raw), "verifiers_rewards": rewards,
            "verifiers_metrics": dict(body.get("metrics") or {})}
    if outcome != raw:
        info["clamped"] = True
    return Verdict(outcome, outcome >= 1.0, info)
