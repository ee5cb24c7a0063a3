"""`envhub sandbox reap | list | check`: sandbox housekeeping from the shell.

Wire it with `register(app)` (from orchestrator/cli.py). Heavy imports stay inside the commands.
Expected failures print `error: <fix>` on stderr and exit with code 2.
"""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer

from envhub.envs.sandbox.kinds import choices

BAD_INPUT = 2
sandbox_app = typer.Typer(help="Sandboxes: list, reap leaked ones, check a backend works.",
                          no_args_is_help=True)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(BAD_INPUT)


@sandbox_app.command("reap")
def reap_cmd(
    run: Annotated[str | None, typer.Option("--run", help="remove the sandboxes of this run")
                   ] = None,
    all_: Annotated[bool, typer.Option("--all", help="remove every envhub sandbox")] = False,
) -> None:
    """Remove leaked sandboxes (docker containers, e2b sandboxes). Default: only those whose
    owner process is gone; --run ID: one run's; --all: every envhub sandbox."""
    from envhub.envs.sandbox import SandboxError, reap

    if run and all_:
        _fail("use either --run ID or --all, not both")
    try:
        removed = reap(run_id=run, stale_only=not (run or all_))
    except SandboxError as e:
        _fail(str(e))
    typer.echo(f"removed {len(removed)} sandbox(es)")
    for sandbox_id in removed:
        typer.echo(f"  {sandbox_id[:12]}")


@sandbox_app.command("list")
def list_cmd() -> None:
    """List envhub docker containers with their run, owner and state."""
    from envhub.envs.sandbox.engine import docker_client, docker_reachable
    from envhub.envs.sandbox.reaper import LABEL_OWNER, LABEL_RUN, LABEL_SANDBOX, owner_alive

    if not docker_reachable():
        _fail("the Docker engine is not reachable; start it (`dockerd &`) or set DOCKER_HOST")
    rows = docker_client().containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}=1"})
    typer.echo(f"{'ID':12}  {'RUN':28}  {'OWNER':28}  STATE")
    for c in rows:
        owner = c.labels.get(LABEL_OWNER, "?")
        state = c.status + ("" if owner_alive(owner) else " (stale: owner gone)")
        typer.echo(f"{c.id[:12]}  {c.labels.get(LABEL_RUN, '?'):28}  {owner:28}  {state}")


@sandbox_app.command("check")
def check_cmd(
    kind: Annotated[str, typer.Argument(help=" | ".join(choices()) + " or a dotted path")
                    ] = "auto",
) -> None:
    """Open a sandbox of KIND, run one command in it, close it: shows the backend works."""
    import asyncio
    import time

    from envhub.envs.sandbox import SandboxError, open_sandbox
    from envhub.envs.sandbox.kinds import check_kind

    try:
        check_kind(kind)
    except ValueError as e:
        _fail(str(e))

    async def probe() -> None:
        start = time.monotonic()
        box = await open_sandbox(kind, run_id="envhub-check")
        opened = time.monotonic() - start
        try:
            result = await box.exec("echo ok; uname -sr", timeout=60)
        finally:
            await box.close()
        typer.echo(f"{getattr(box, 'kind', kind)}: opened in {opened:.2f}s, exec exit "
                   f"{result.exit_code}: {result.stdout.strip()}")
        if result.exit_code != 0:
            _fail(f"the probe command failed: {result.stderr.strip()}")

    try:
        asyncio.run(probe())
    except SandboxError as e:
        _fail(str(e))


def register(app: typer.Typer) -> None:
    """Add `envhub sandbox ...` to the top-level app."""
    app.add_typer(sandbox_app, name="sandbox")
