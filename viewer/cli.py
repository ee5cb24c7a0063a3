"""`envhub view PATH|POOL_URL`: serve the viewer until interrupted. Only typer is imported at
top level, so `envhub --help` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from fastapi import FastAPI

    from envhub.viewer.config import ViewConfig


def view(
    source: str = typer.Argument(..., metavar="PATH|POOL_URL",
                                 help="a run folder (runs/<run_id>), a folder of them (runs/), "
                                      "or a pool URL (sqlite:///FILE, postgresql://...)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on (loopback: the viewer "
                                               "has no authentication)"),
    port: int = typer.Option(8600, help="port; 0 picks a free one"),
    tokenizer: Path = typer.Option(None, help="tokenizer folder for decoding ids (default: the "
                                              "run's --model, else the bundled model)"),
    allow_remote: bool = typer.Option(False, "--allow-remote",
                                      help="allow a non-loopback --host"),
) -> None:
    """Browse runs and sessions in a local web page: rewards, status, and each session's
    token-level trajectory."""
    from pydantic import ValidationError

    from envhub.viewer.app import create_app
    from envhub.viewer.config import ViewConfig
    from envhub.viewer.errors import ViewerError
    from envhub.viewer.sources import open_source
    from envhub.viewer.tokens import TokenDecoder

    try:
        config = ViewConfig(source=source, host=host, port=port, tokenizer=tokenizer,
                            allow_remote=allow_remote)
        if config.tokenizer is not None:
            TokenDecoder(config.tokenizer)  # a bad --tokenizer fails now, not on a page
        opened = open_source(config.source, config.tokenizer)
    except ValidationError as e:
        _fail("; ".join(_problem(err) for err in e.errors()))
    except ViewerError as e:
        _fail(str(e))
    try:
        _serve(create_app(opened), config)
    finally:
        opened.close()


def _serve(app: FastAPI, config: ViewConfig) -> None:
    import uvicorn

    from envhub.sdk.serve import bind

    try:
        sock = bind(config.host, config.port)
    except OSError as e:
        _fail(f"cannot listen on {config.host}:{config.port} ({e.strerror}); pick another "
              "--port")
    host, port = sock.getsockname()[:2]
    typer.echo(f"envhub view: http://{host}:{port}/  (Ctrl-C to stop)", err=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def _problem(err: Any) -> str:
    """One pydantic error as the flag it came from: `--port: Input should be ...`."""
    field = "_".join(str(p) for p in err.get("loc", ()))
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"--{field.replace('_', '-')}: {message}" if field else message


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command("view")(view)
