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


class RunConfigError(ValueError):
    """Inconsistent run options (e.g. --resume without --out)."""
