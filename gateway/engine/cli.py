"""`envhub engine`: serve a local model (or the zero-work engine) over vLLM's token API.

The lead wires `engine_command` into `gateway/cli.py` (`app.command("engine")(engine_command)`).
"""

from __future__ import annotations

import typer

ZERO = "zero"


def engine_command(
    model: str = typer.Option(
        None, "--model", help="local HF model folder; 'zero' for the zero-work engine; "
        "default: the bundled tiny Qwen2 model"),
    host: str = typer.Option("127.0.0.1", help="interface to listen on"),
    port: int = typer.Option(8000, help="TCP port"),
    device: str = typer.Option("auto", help="'auto', 'cpu', 'cuda', 'cuda:1', ..."),
    dtype: str = typer.Option("auto", help="'auto', 'float32', 'bfloat16', 'float16'"),
    max_batch_size: int = typer.Option(32, min=1, help="most sequences decoded together"),
    max_model_len: int = typer.Option(None, min=1, help="prompt + completion token limit"),
    weight_version: int = typer.Option(0, help="version reported before any weight update"),
    seed: int = typer.Option(0, help="seed for requests that bring none"),
    threads: int = typer.Option(None, min=1, help="torch CPU threads"),
    served_model_name: str = typer.Option(None, help="model name in responses"),
    zero: bool = typer.Option(False, "--zero", help="same as --model zero"),
    zero_length: int = typer.Option(8, min=1, help="zero engine: completion length in tokens"),
    log_level: str = typer.Option("warning", help="uvicorn log level"),
) -> None:
    """Serve token-in/token-out completions (vLLM's /v1/completions shape) with batching."""
    import uvicorn

    from envhub.gateway.engine.config import BUNDLED_MODEL, EngineConfig
    from envhub.gateway.engine.server import create_app

    if zero or model == ZERO:
        from transformers import AutoTokenizer

        from envhub.gateway.engine.zero import ZeroEngine

        engine = ZeroEngine(zero_length, weight_version=weight_version,
                            name=served_model_name or ZERO,
                            tokenizer=AutoTokenizer.from_pretrained(BUNDLED_MODEL))
    else:
        from envhub.gateway.engine.engine import Engine

        config = EngineConfig(
            model=model or str(BUNDLED_MODEL), device=device, dtype=dtype,
            max_batch_size=max_batch_size, max_model_len=max_model_len,
            weight_version=weight_version, seed=seed, threads=threads, name=served_model_name)
        try:
            engine = Engine(config)
        except (FileNotFoundError, ValueError, ImportError, RuntimeError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    typer.echo(f"envhub engine: {engine.name} (weight version {engine.weight_version}) on "
               f"http://{host}:{port}", err=True)
    uvicorn.run(create_app(engine), host=host, port=port, log_level=log_level)
