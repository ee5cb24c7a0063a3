"""What the orchestrator's commands share: bad input exits 2 with the fix, the errors that are
the user's to fix, and SIGTERM cancelling a run like Ctrl-C does."""

from __future__ import annotations

from typing import Any, NoReturn

import typer

BAD_INPUT = 2


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(BAD_INPUT)


def user_errors() -> tuple[type[BaseException], ...]:
    from pydantic import ValidationError

    from envhub.envs.errors import AgentSpecError, EnvLoadError, RunConfigError
    from envhub.envs.manifest import ManifestError
    from envhub.envs.sandbox.errors import SandboxUnavailable

    return (ManifestError, EnvLoadError, RunConfigError, AgentSpecError, SandboxUnavailable,
            ValidationError)


def describe(e: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(e, ValidationError):
        return "; ".join(f"{flag(err['loc'])}: {err['msg']}" for err in e.errors())
    return str(e)


FLAGS = {"k": "-k", "n": "-n", "envs": "ENVS", "time_limit_s": "--time-limit",
         "tasks": "--task"}


def flag(loc: tuple[Any, ...]) -> str:
    """The CLI flag a RunConfig field comes from (fields map 1:1 onto flags)."""
    if not loc:
        return "options"
    field = str(loc[0])
    return FLAGS.get(field, "--" + field.replace("_", "-"))


async def cancellable(coro: Any) -> Any:
    """Run `coro` so that SIGTERM cancels it like Ctrl-C does: the runner's cleanup (closing
    sandboxes, killing agent processes, removing its scratch folder) runs either way."""
    import asyncio
    import signal

    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
