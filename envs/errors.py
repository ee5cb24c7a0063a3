"""Errors of the environment runtime (loader, agents, runner); each message states the fix.

Sandbox errors live in `envhub.envs.sandbox.errors`; a bad manifest is
`envhub.envs.manifest.ManifestError`.
"""

from __future__ import annotations


class EnvLoadError(ValueError):
    """An environment package could not be loaded (bad entrypoint, unreadable tasks)."""


class EnvNotFound(EnvLoadError):
    """No environment answers to a name, path or registry reference."""


class AgentSpecError(ValueError):
    """An `--agent` value that cannot be turned into an agent."""


class AgentError(RuntimeError):
    """The agent failed on its own (crash, bad request it made): the rollout is `agent_error`."""


class AgentOutputError(Exception):
    """What the agent left for grading cannot be graded (a file past the read limit, ...): the
    agent's doing, so the rollout scores 0 with a process signal naming it, never env_failure
    (a dropped sample would let a policy escape its bad groups that way)."""


class RunConfigError(ValueError):
    """Inconsistent run options (e.g. --resume without --out)."""
