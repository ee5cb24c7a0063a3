"""Errors raised by sandboxes and image builds; each message states the fix."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """A sandbox operation failed for an infrastructure reason (the runner maps it to
    `env_failure`, never to a reward of 0)."""


class SandboxUnavailable(SandboxError):
    """The requested backend cannot run here (missing extra, engine not running, no key)."""


class SandboxClosed(SandboxError):
    """The sandbox was closed (or reaped) before this call."""


class SandboxFileError(SandboxError):
    """A file operation was refused or failed (missing file, path outside the workdir)."""


class ImageBuildError(SandboxError):
    """Building the base image or an environment image failed; the message holds the log tail."""
