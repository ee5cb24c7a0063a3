"""`envhub engine`: serve a local model (or the zero-work engine) over vLLM's token API.

Options are the fields of `EngineServeConfig`: the engine's own config plus where to serve it
(sdk/config_cli.py). gateway/cli.py registers the command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from pydantic import Field

from envhub.gateway.engine.config import BUNDLED_MODEL, EngineConfig
from envhub.sdk.config_cli import config_command

if TYPE_CHECKING:
    from envhub.gateway.engine.server import ServedEngine

ZERO = "zero"


class EngineServeConfig(EngineConfig):
    """`envhub engine`: an `EngineConfig` and how to serve it."""

    model: str = Field(str(BUNDLED_MODEL), description="local HF model folder (config + "
                       "weights); 'zero' for the zero-work engine; default: the bundled tiny "
                       "Qwen2 model")
    host: str = Field("127.0.0.1", description="interface to listen on")
    port: int = Field(8000, ge=0, le=65535, description="TCP port")
    zero: bool = Field(False, description="serve the zero-work engine (same as --model zero)")
    zero_length: int = Field(8, ge=1, description="zero engine: completion length in tokens")
    log_level: str = Field("warning", description="uvicorn log level")
    health_version: bool = Field(True, description="report the weight version on /health; "
                                 "off: an empty 200 like vLLM's (the version only on "
                                 "/weight_info), to exercise clients of a real vLLM")


def serve_engine(config: EngineServeConfig) -> None:
    """Serve token-in/token-out completions (vLLM's /v1/completions shape) with batching."""
    import uvicorn

    from envhub.gateway.engine.server import create_app

    engine: ServedEngine
    if config.zero or config.model == ZERO:
        from transformers import AutoTokenizer

        from envhub.gateway.engine.zero import ZeroEngine

        engine = ZeroEngine(config.zero_length, weight_version=config.weight_version,
                            name=config.name or ZERO,
                            tokenizer=AutoTokenizer.from_pretrained(BUNDLED_MODEL))
    else:
        from envhub.gateway.engine.engine import Engine

        try:
            engine = Engine(config)
        except (FileNotFoundError, ValueError, ImportError, RuntimeError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    typer.echo(f"envhub engine: {engine.name} (weight version {engine.weight_version}) on "
               f"http://{config.host}:{config.port}", err=True)
    uvicorn.run(create_app(engine, health_version=config.health_version), host=config.host,
                port=config.port, log_level=config.log_level)


# Flag names kept from earlier releases: --served-model-name is vLLM's; --zero is a plain flag.
engine_command = config_command(EngineServeConfig, serve_engine,
                                flags={"name": "--served-model-name", "zero": "--zero"})
