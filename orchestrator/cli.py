"""`envhub list | info | run | init`: the environment runtime's commands.

Heavy imports happen inside the commands so `envhub --help` stays fast. Bad input (a bad
manifest, an unknown environment, inconsistent flags) exits with code 2 and a message that says
how to fix it; a run that completes exits 0 even when some rollouts failed (see the table).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import Field

from envhub.orchestrator.console import cancellable, describe, fail, user_errors
from envhub.orchestrator.groups.config import RunConfig
from envhub.sdk.config_cli import config_command


def list_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Environments available: built-in and installed."""
    import json

    from rich.console import Console
    from rich.table import Table

    from envhub.envs.manifest import ManifestError, load_manifest
    from envhub.orchestrator.catalog import available_envs, resolve_folder

    rows: list[dict[str, Any]] = []
    for name, source in available_envs().items():
        try:
            m = load_manifest(resolve_folder(name))
            rows.append({"name": name, "version": m.version, "source": source,
                         "description": m.description, "tools": m.tools})
        except (ManifestError, ValueError) as e:
            rows.append({"name": name, "version": "?", "source": source,
                         "description": f"(broken: {e})", "tools": []})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="environments")
    for col in ("name", "version", "source", "tools", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["version"], r["source"], ", ".join(r["tools"]),
                      r["description"])
    Console().print(table)


def info_command(
    env: str = typer.Argument(..., help="Built-in name, folder path or owner/name@version."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    show: int = typer.Option(5, "--show", min=0, help="How many task ids to list."),
) -> None:
    """An environment's manifest, tasks, tools and reward weights."""
    import json

    from envhub.envs.loader import check_tools
    from envhub.orchestrator.catalog import load_env

    try:
        loaded = load_env(env)
        tasks = loaded.env.load_tasks()
        check_tools(loaded, tasks)
    except user_errors() as e:
        fail(describe(e))
    data: dict[str, Any] = {
        "folder": str(loaded.folder), **loaded.manifest.model_dump(mode="json"),
        "task_count": len(tasks), "task_ids": [t.id for t in tasks[:show]],
        "tools": list(loaded.env.tools(tasks[0])) if tasks else loaded.manifest.tools,
    }
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    m = loaded.manifest
    more = ", ..." if len(tasks) > show else ""
    lines = [
        f"{m.name} {m.version}  ({loaded.folder})", f"  {m.description}",
        f"  entrypoint: {m.entrypoint}",
        f"  tasks: {len(tasks)} ({', '.join(data['task_ids'])}{more})",
        f"  tools: {', '.join(data['tools'])}",
        f"  rewards: {', '.join(f'{k}={v:g}' for k, v in m.reward_weights().items())}",
        f"  sandbox: {m.sandbox.model_dump(exclude_none=True)}",
        f"  agent limits: {m.agent.model_dump()}",
    ]
    typer.echo("\n".join(lines))


class RunCommand(RunConfig):
    """`envhub run`'s options: a RunConfig and how to show the run."""

    quiet: bool = Field(False, description="no progress display")


def run_main(command: RunCommand) -> None:
    """Run agents on environments: k samples per task, rewards to the pool, results table."""
    import asyncio

    from envhub.orchestrator.groups import run
    from envhub.orchestrator.groups.progress import failure_lines, results_table, table_console

    started: list[Path] = []
    command.apply_sandbox_disk()

    def announce(run_id: str, folder: Path) -> None:
        started.append(folder)
        typer.echo(f"run {run_id}: results go to {folder}/", err=True)

    config = RunConfig.model_validate(command.model_dump(exclude={"quiet"}))
    try:
        outcome = asyncio.run(cancellable(run(config, progress=not command.quiet,
                                              on_start=announce)))
    except user_errors() as e:
        fail(describe(e))
    except (KeyboardInterrupt, asyncio.CancelledError):
        more = f" (continue with --resume --out {started[0]})" if started else ""
        typer.echo(f"interrupted; sandboxes, agent processes and temporary files were cleaned "
                   f"up{more}", err=True)
        raise typer.Exit(130) from None
    console = table_console()
    console.print(results_table(outcome.records))
    for line in failure_lines(outcome.records):
        console.print(line, markup=False, highlight=False)
    typer.echo(f"run {outcome.run_id}: {len(outcome.records)} rollouts\n"
               + where_to_look(outcome.out, pool=not config.gateway))


# Flag names kept from earlier releases, and the short ones.
RUN_FLAGS: dict[str, str | tuple[str, ...]] = {
    "agent": ("--agent", "-a"), "model": ("--model", "-m"), "sandbox": ("--sandbox", "-s"),
    "n": "-n", "k": "-k", "concurrency": ("--concurrency", "-c"), "tasks": ("--task", "-t"),
    "out": ("--out", "-o"), "time_limit_s": "--time-limit", "service_wait_s": "--service-wait",
    "quiet": ("--quiet", "-q")}
RUN_ENVVARS = {"admin_key": "ENVHUB_ADMIN_KEY", "services_token": "ENVHUB_SERVICES_TOKEN"}
run_command = config_command(RunCommand, run_main, arguments=("envs",), flags=RUN_FLAGS,
                             envvars=RUN_ENVVARS)


def where_to_look(folder: Path, pool: bool) -> str:
    """What a run kept and the commands that read it."""
    lines = [f"results: {folder}/  (summary.json, rollouts/<env>__<task>__<sample>.json"
             + (", pool.db: every model call with its token ids)" if pool else ")")]
    if pool:
        db = f"sqlite:///{folder}/pool.db"
        lines += [f"  trajectories: envhub export --db {db} --format jsonl --out "
                  f"{folder}/trajectories.jsonl",
                  f"  training rows: envhub export --db {db} --format verl --out "
                  f"{folder}/verl.parquet"]
    else:
        lines.append("  trajectories: in the pool of --gateway (envhub export --gateway URL ...)")
    return "\n".join(lines)


def serve_command(
    env: str = typer.Argument(..., help="Built-in name, folder path or owner/name@version."),
    orchestrator: str = typer.Option(..., "--orchestrator", help="URL where the run's task "
                                     "services register (envhub run --services HOST:PORT)."),
    name: str | None = typer.Option(None, "--name", help="Register as this name (a run asks "
                                    "for service:NAME); default the environment's name."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port (0: a free one)."),
    advertise: str | None = typer.Option(None, "--advertise", help="URL the orchestrator "
                                         "reaches this service at (default http://HOST:PORT)."),
    token: str = typer.Option(..., "--token", envvar="ENVHUB_SERVICES_TOKEN", help="The run's "
                              "services token (envhub run --services-token)."),
    capacity: int = typer.Option(64, "--capacity", min=1, max=4096, help="Rollouts at once."),
    agent: str | None = typer.Option(None, "--agent", "-a", help="The service's agent "
                                     "(default: the environment's own, vf for verifiers "
                                     "environments, else tool): tool | tool:summarize | oracle "
                                     "| vf | a command line (as envhub run)."),
    agent_install: Annotated[list[str] | None, typer.Option(
        "--agent-install", help="As envhub run's (repeatable).")] = None,
    sandbox: str | None = typer.Option(None, "--sandbox", "-s", help="Sandbox kind (default: "
                                       "the manifest's choice)."),
) -> None:
    """Serve an environment as a task service: register with a run's orchestrator and run the
    rollouts it asks for (protocol: orchestrator/groups/services)."""
    import asyncio

    from envhub.orchestrator.groups.services.serve import ServeOptions, serve

    opts = ServeOptions(env=env, orchestrator=orchestrator, token=token, name=name, host=host,
                        port=port, advertise=advertise, capacity=capacity, agent=agent,
                        agent_install=tuple(agent_install or ()), sandbox=sandbox)
    if not orchestrator.startswith(("http://", "https://")):
        fail(f"--orchestrator {orchestrator}: use a URL such as http://127.0.0.1:7000")
    try:
        asyncio.run(serve(opts))
    except user_errors() as e:
        fail(describe(e))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def init_command(
    name: str = typer.Argument(..., help="Folder to create (its name is the env name)."),
    env_name: str | None = typer.Option(None, "--name", help="Env name if not the folder's."),
    source: str | None = typer.Option(
        None, "--from", help="Generate the package from a dataset: rg:NAME[key=value,...] (a "
        "reasoning-gym dataset with its size, seed and config; envs/rg)."),
) -> None:
    """Scaffold a new environment package that `envhub run ./NAME --agent oracle` solves."""
    from envhub.envs.scaffold import scaffold

    target = Path(name)
    files = "envhub.toml, env.py, tasks.jsonl, README.md"
    try:
        if source is None:
            folder = scaffold(target, env_name)
        elif source.startswith("rg:"):
            from envhub.envs.rg import parse_reference
            from envhub.envs.rg.package import write_package

            folder = write_package(target, parse_reference(source), source, env_name)
            files = "envhub.toml, env.py, README.md"
        else:
            fail(f"--from {source}: give rg:NAME[key=value,...] (a reasoning-gym dataset)")
    except user_errors() as e:  # RunConfigError (the folder, the name), EnvLoadError (--from)
        fail(describe(e))
    # pathlib drops a leading "./"; keep it so the hint reads as a path, not a name
    rel = str(folder) if folder.is_absolute() else f"{os.curdir}{os.sep}{folder}"
    typer.echo(f"created {folder}/ ({files})\n"
               f"try: envhub run {rel} --agent oracle")


def register(app: typer.Typer) -> None:
    """Add this component's commands to the top-level app."""
    app.command("list")(list_command)
    app.command("info")(info_command)
    app.command("run")(run_command)
    app.command("init")(init_command)
    app.command("serve")(serve_command)
    from envhub.orchestrator.train_cli import train_command

    app.command("train")(train_command)
    from envhub.envs.builtin.search import synth_cli
    from envhub.envs.images import cli as images_cli
    from envhub.envs.sandbox import cli as sandbox_cli
    from envhub.orchestrator.audit import cli as audit_cli

    sandbox_cli.register(app)
    images_cli.register(app)
    audit_cli.register(app)
    synth_cli.register(app)
