"""`envhub gateway` (and `envhub engine`, served by gateway/engine). Options are the fields of
`GatewayConfig` (sdk/config_cli.py), so every field has a flag."""

from __future__ import annotations

from importlib.util import find_spec

import typer

from envhub.gateway.config import GatewayConfig
from envhub.sdk.config_cli import config_command

# Flag names that differ from the field names (kept from earlier releases and the docs).
FLAGS = {"upstreams": "--upstream", "model_aliases": "--model-alias"}
ENVVARS = {"admin_key": "ENVHUB_ADMIN_KEY"}


def serve_gateway(config: GatewayConfig) -> None:
    """Run the gateway: OpenAI-compatible, token-exact recording into the pool."""
    from envhub.gateway.backends import check_backend
    from envhub.gateway.errors import GatewayError
    from envhub.gateway.server import serve

    try:
        check_backend(config)
        if config.backend == "local" and find_spec("torch"):
            # A GPU it lacks, said before the engine loads (no torch: the engine names the extra)
            from envhub.sdk.device import resolve_device

            resolve_device(config.device)
    except (GatewayError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    if not config.model_path().exists():
        typer.echo(f"error: model folder {config.model_path()} does not exist; pass --model "
                   "PATH to a Hugging Face model folder", err=True)
        raise typer.Exit(2)
    serve(config)


gateway = config_command(GatewayConfig, serve_gateway, flags=FLAGS, envvars=ENVVARS)


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)
    try:
        from envhub.gateway.engine.cli import engine_command
    except ImportError:  # the engine module is optional in a partial install
        return
    app.command("engine")(engine_command)
