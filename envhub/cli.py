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


@app.command("train")
def train_command(
    env: str = typer.Argument("arith", help="environment to train on (built-in or path)"),
    steps: int = typer.Option(20, min=1, help="optimizer steps, one rollout batch each"),
    seed: int = typer.Option(0, help="seed for torch, task order and sampling"),
    out: str = typer.Option("runs/train", help="folder for metrics.jsonl, pool.db, weights/"),
    groups: int = typer.Option(4, min=1, help="tasks (groups) per step"),
    k: int = typer.Option(4, min=2, help="samples per task (group size)"),
    concurrency: int = typer.Option(16, min=1, help="rollouts in flight"),
    lr: float = typer.Option(3e-4, min=0, help="AdamW learning rate"),
    tau: int = typer.Option(2, min=0, help="staleness bound in weight versions"),
    window: int = typer.Option(0, min=0, help="windowed-FIFO size (0: greedy)"),
    model: str = typer.Option(None, help="HF model folder (default: the bundled model)"),
    max_turns: int = typer.Option(None, min=1, help="override the env's max_turns"),
) -> None:
    """Train on an environment: gateway + rollouts + trainer + weight sync, on CPU."""
    from pathlib import Path

    from envhub.train import TrainLoopConfig, train

    if model is not None and not Path(model).is_dir():
        typer.echo(f"error: --model {model} is not a folder; pass a Hugging Face model folder",
                   err=True)
        raise typer.Exit(2)
    cfg = TrainLoopConfig(env=env, steps=steps, seed=seed, out=Path(out), groups=groups, k=k,
                          concurrency=concurrency, lr=lr, tau=tau, window=window or None,
                          model=model, max_turns=max_turns)
    try:
        from envhub.envs.loader import load_env

        load_env(env)
    except Exception as e:  # unknown env, bad manifest: the loader's message says the fix
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    train(cfg, log=typer.echo)


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
