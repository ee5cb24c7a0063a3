"""The environment contract: what an environment package's entrypoint implements.

An entrypoint class (named in `envhub.toml` as 'module:Class') is constructed with its package
folder and manifest, and does not inherit anything: it only has to have these methods.

Grading rule (every verifier, built in or not): **grade only what the agent could not have
touched.** RL optimises the policy against `verify`, so whatever the agent can reach that
changes the verdict will be found. A verifier therefore:
* produces the verdict in a sandbox the agent never ran in, started from the pristine image,
  holding only the agent's *declared* outputs (a diff, a deck, the artifact paths a task
  names, a state reachable only through the environment's own tools), read with a size cap;
* runs with the grader's own toolchain (interpreters, test runners, browsers from the image
  or the host, never from the agent's sandbox) and treats code from the agent's output as
  hostile inside the grading process too (swe-task: canaries and a runner guard);
* attributes failures: a grading failure caused by what the agent produced is outcome 0 with
  a process signal naming it (`UNGRADABLE`, `grading_tampered`); `env_failure` only when the
  infrastructure failed independently of the agent's output, e.g. the pristine control run
  fails the same way. An agent must never be able to turn its failure into a dropped sample.
`envhub audit ENV` runs generic cheating agents against an environment and fails when any
beats a no-op or escapes into env_failure: run it on every environment you write.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from envhub.envs.manifest import Manifest, SandboxSpec
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.tools.result import ToolResult  # what environment-defined tools return too
from envhub.sdk.types import Signal


@dataclass
class Task:
    id: str
    instruction: str  # what the agent is told (the first user message)
    data: dict[str, Any] = field(default_factory=dict)  # the raw task row


@dataclass
class Verdict:
    """The verifier's answer. `env_failure` set means grading could not complete: the rollout
    is excluded from training, never scored 0."""

    outcome: float  # in [0, 1]
    resolved: bool
    info: dict[str, Any] = field(default_factory=dict)
    env_failure: str | None = None
    # process signals of the grading itself (e.g. grading_tampered), scored like the turns'
    signals: list[Signal] = field(default_factory=list)
    # the agent's declared output as text (an answer, a report), read with a size cap: what a
    # model judge grades (reward component `judge`, envs/rewards/judge); None: nothing to judge
    output: str | None = None


# The process signal of a rollout whose output could not be graded because of what the agent
# left (a file past the read limit, an app state the app did not write, tests its patch made
# hang): scored 0 with it, never env_failure.
UNGRADABLE = "ungradable_output"


class EnvFailure(Exception):
    """Infrastructure failed (sandbox crash, image build, infra timeout): not the agent's fault."""


@dataclass
class RunContext:
    """What the runner hands an environment: how to get sandboxes, where to put scratch files."""

    run_id: str
    sandbox_kind: str  # docker | local | e2b
    open_sandbox: Callable[[SandboxSpec], Awaitable[Sandbox]]
    scratch: Path
    options: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    manifest: Manifest

    def load_tasks(self) -> list[Task]: ...

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        """A sandbox prepared for the task (repo checked out, files in place)."""
        ...

    def tools(self, task: Task) -> list[str]: ...

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        """Apply the gold solution (the `oracle` agent)."""
        ...

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        """Grade the rollout by the grading rule above: `sandbox` is the agent's, to read its
        declared outputs from (capped), never to run the verdict in."""
        ...


@runtime_checkable
class GradingBudget(Protocol):
    """Optional: an environment whose grading may take longer than its sandbox spec's
    `setup_timeout_s` (the runner's default bound on `verify`) says how long it may take for a
    task: a grader that retries a failed run in a fresh sandbox and then runs a control needs
    up to three runs. A verify past the budget is env_failure, so a budget too short would let
    a patch that hangs the grader escape its 0."""

    def verify_budget_s(self, task: Task) -> float: ...


@runtime_checkable
class ToolProvider(Protocol):
    """Optional second face of an environment: tools of its own. The agent offers these schemas
    (OpenAI function-tool format) for the names they cover and routes those calls here; every
    other name in `tools(task)` goes to the shared tools of `envhub.envs.tools`."""

    def tool_schemas(self, task: Task) -> list[dict[str, Any]]: ...

    async def call_tool(
        self, task: Task, name: str, arguments: str, sandbox: Sandbox, state: dict[str, Any]
    ) -> ToolResult:
        """Run one call; bad `arguments` (JSON text as the model wrote it) is an error result,
        never an exception."""
        ...
