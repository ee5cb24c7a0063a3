"""`envhub` console script: wires each component's commands into one Typer app.

Each component owns `<component>/cli.py` with `register(app)`; those modules import only
typer at top level so `envhub --help` stays fast and works without heavy extras.
"""

from __future__ import annotations

import typer

from envhub import __version__

app = typer.Typer(
    name="envhub",
    help="Token-exact gateway, environments, registry and trainer for RL on LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    pass


def _register_all() -> None:
    from envhub.envs import cli as envs_cli
    from envhub.gateway import cli as gateway_cli
    from envhub.registry import cli as registry_cli
    from envhub.trainer import cli as trainer_cli

    for module in (gateway_cli, envs_cli, registry_cli, trainer_cli):
        module.register(app)


_register_all()


def main() -> None:
    app()
