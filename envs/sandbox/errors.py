"""Errors raised by sandboxes and image builds; each message states the fix."""

from __future__ import annotations

from envhub.envs.errors import AgentOutputError


class SandboxError(RuntimeError):
    """A sandbox operation failed for an infrastructure reason (the runner maps it to
    `env_failure`, never to a reward of 0)."""


class SandboxUnavailable(SandboxError):
    """The requested backend cannot run here (missing extra, engine not running, no key)."""


class SandboxClosed(SandboxError):
    """The sandbox was closed (or reaped) before this call."""


class SandboxFileError(SandboxError):
    """A file operation was refused or failed (missing file, path outside the workdir)."""


class FileTooLarge(SandboxFileError, AgentOutputError):
    """A file in the sandbox is larger than the read's limit: refused before its bytes reach
    the host's memory. Verifiers that treat a missing answer as 0 treat this one so too;
    elsewhere the runner scores it 0 (AgentOutputError)."""

    def __init__(self, path: str, size: int, limit: int):
        super().__init__(f"{path} is {size} bytes, over the {limit}-byte read limit")
        self.path, self.size, self.limit = path, size, limit


class ImageBuildError(SandboxError):
    """Building the base image or an environment image failed; the message holds the log tail."""
