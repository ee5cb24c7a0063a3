"""Prime Intellect's verifiers environments (verifiers 0.4, its `verifiers.v1` API), run as they
are: their tasksets' tasks, their harness (agent loop) pointed at the rollout's gateway session,
their tasks' reward functions as the outcome.

    envhub run vf:./my_tasks.py -n 8 -k 4        # a module (or package folder) exporting a Taskset
    envhub run vf:my-taskset                     # a taskset package installed in .venv-verifiers

verifiers lives in its own interpreter (`bash scripts/verifiers_venv.sh` -> .venv-verifiers; its
pins conflict with envhub's), so envhub talks to it through worker.py, one process per call.
A folder package (`envhub.toml` with `entrypoint = "env:Env"`, an env.py holding
`from envhub.envs.verifiers import VerifiersEnv as Env`, and `[metadata] verifiers = "MODULE"`)
packs and publishes like any other.

Supported: `vf.Taskset`/`vf.Task` (finite tasksets), SingleAgentEnv and a taskset's own `Env`,
the `null` chat harness (the default here, in place of verifiers' `bash`), any bundled harness
that runs no model code, `@vf.reward`/`@vf.metric` functions reading `task` and `trace`,
config-plugged rewards. Not supported (refused at load, exit 2): code-executing harnesses
(bash, codex, claude_code, mini_swe_agent, ...), tasks that need a container, MCP toolsets
that would run on this machine (verifiers' default `subprocess` runtime, or colocated with the
harness; a toolset with a docker/apptainer/e2b/modal/prime runtime or a remote `url` runs),
rewards/metrics that read the rollout's runtime, model judges, infinite tasksets.
Their agent is `vf` (the default) or `oracle`; any other --agent is refused at plan time.
"""

from __future__ import annotations

from pathlib import Path

from envhub.envs.manifest import Manifest, SandboxSpec, name_from
from envhub.envs.verifiers.env import VerifiersEnv
from envhub.envs.verifiers.process import (
    VerifiersUnavailable,
    VerifiersUnsupported,
    WorkerFailed,
)

PREFIX = "vf:"


def manifest_for(ref: str) -> tuple[Path, Manifest]:
    """The folder and synthetic manifest a `vf:REF` reference runs with."""
    target = ref[len(PREFIX):]
    path = Path(target).expanduser()
    if path.exists():
        folder, module = path.resolve().parent, path.resolve().name
        stem = path.stem
    else:
        folder, module, stem = Path.cwd(), target, target.rsplit("/", 1)[-1].split("@")[0]
    manifest = Manifest(
        name=name_from(stem, "verifiers"), version="0.0.0", entrypoint="env:VerifiersEnv", tools=[],
        description=f"verifiers environment {target} (run as it is)",
        sandbox=SandboxSpec(kind="none"), metadata={"verifiers": module})
    return folder, manifest


__all__ = ["PREFIX", "VerifiersEnv", "VerifiersUnavailable", "VerifiersUnsupported",
           "WorkerFailed", "manifest_for"]
