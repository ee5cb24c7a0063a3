"""`envhub gateway` (and `envhub engine`, served by gateway/engine)."""

from __future__ import annotations

import typer

from envhub.gateway.config import GatewayConfig


def gateway(
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8400, help="port (0: a free one)"),
    model: str | None = typer.Option(None, help="HF model folder (default: bundled tiny)"),
    model_name: str | None = typer.Option(None, help="name served on /v1/models"),
    tokenizer: str | None = typer.Option(None, help="tokenizer folder, if not the model's"),
    chat_template: str | None = typer.Option(None, help="jinja file or 'deepseek_v3'"),
    backend: str = typer.Option("local", help="local | vllm | sglang | zero | openai, or "
                                              "a dotted path pkg.mod.Class"),
    upstream: list[str] = typer.Option([], help="engine URL (repeatable), e.g. "
                                                "vllm=http://h1:8000"),
    db: str = typer.Option("sqlite:///envhub-pool.db", help="pool URL (sqlite:///FILE or "
                                                           "postgresql://...)"),
    admin_key: str | None = typer.Option(None, envvar="ENVHUB_ADMIN_KEY",
                                            help="require this key for /sessions admin calls"),
    max_body_bytes: int = typer.Option(64 << 20, help="request body limit in bytes"),
    default_max_tokens: int = typer.Option(256, help="completion budget when none is set"),
    max_model_len: int = typer.Option(32768, help="prompt + completion token limit"),
    device: str | None = typer.Option(None, help="torch device for the local engine"),
    fleet_config: str | None = typer.Option(None, help="TOML/YAML file listing upstreams "
                                                          "([[upstream]] kind, url, name)"),
    heartbeat_interval: float = typer.Option(1.0, help="seconds between engine health probes"),
    heartbeat_misses: int = typer.Option(2, help="missed beats / failed calls in a row that "
                                                 "take an engine out of rotation"),
    fleet_retries: int = typer.Option(2, help="extra attempts of a failed engine call, each "
                                              "on another engine"),
    pause_wait: float = typer.Option(60.0, help="seconds a call waits during a weight-update "
                                                "pause before it gets 429"),
) -> None:
    """Run the gateway: OpenAI-compatible, token-exact recording into the pool."""
    from pydantic import ValidationError

    from envhub.gateway.server import serve

    try:
        config = GatewayConfig(
            host=host, port=port, model=model, model_name=model_name, tokenizer=tokenizer,
            chat_template=chat_template, backend=backend, upstreams=upstream, db=db,
            admin_key=admin_key, max_body_bytes=max_body_bytes,
            default_max_tokens=default_max_tokens, max_model_len=max_model_len, device=device,
            fleet_config=fleet_config, heartbeat_interval=heartbeat_interval,
            heartbeat_misses=heartbeat_misses, fleet_retries=fleet_retries,
            pause_wait=pause_wait)
    except ValidationError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    from envhub.gateway.backends import check_backend
    from envhub.gateway.errors import GatewayError

    try:
        check_backend(config)
    except (GatewayError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    if not config.model_path().exists():
        typer.echo(f"error: model folder {config.model_path()} does not exist; pass --model "
                   "PATH to a Hugging Face model folder", err=True)
        raise typer.Exit(2)
    serve(config)


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)
    try:
        from envhub.gateway.engine.cli import engine_command
    except ImportError:  # the engine module is optional in a partial install
        return
    app.command("engine")(engine_command)
