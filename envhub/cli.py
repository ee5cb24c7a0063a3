"""`envhub` console script: wires each component's commands into one Typer app.

Each component owns `<component>/cli.py` with `register(app)`; those modules import only
typer at top level so `envhub --help` stays fast and works without heavy extras.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

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


# Libraries' own switches for their chatter, set before any of them is imported (the commands
# import lazily) and inherited by every process a command starts (ranks, rollout workers):
# transformers' load progress bars and advice-level logging. `envhub -v` leaves them as they are.
QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
             "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the libraries' "
                                 "progress bars and warnings (quiet by default)."),
) -> None:
    if not verbose:
        for name, value in QUIET_ENV.items():
            os.environ.setdefault(name, value)


@app.command("export")
def export_command(
    out: str = typer.Option(..., "--out", "-o", help="file to write"),
    fmt: str = typer.Option(None, "--format", "-f", help="jsonl | parquet (the pool's "
                            "trajectories) | atif (Harbor's ATIF, one document a line) | "
                            "verl | trl (training rows with advantages); "
                            "default: verl with --gateway/--jsonl, else jsonl"),
    db: str = typer.Option(None, help="pool URL to read (sqlite:///FILE or postgresql://...)"),
    gateway: str = typer.Option(None, help="a gateway's URL to read the pool from"),
    admin_key: str = typer.Option(None, envvar="ENVHUB_ADMIN_KEY", help="its admin key"),
    jsonl: str = typer.Option(None, help="verl/trl: read trajectories from a JSONL export "
                              "(or give --db or --gateway)"),
    group_id: str = typer.Option(None, help="jsonl/parquet: only this group"),
    status: str = typer.Option(None, help="jsonl/parquet: only sessions with this status"),
    window: int = typer.Option(None, min=1, help="verl/trl: windowed-FIFO size"),
    max_groups: int = typer.Option(None, min=1, help="verl/trl: at most this many groups"),
    group_size: int = typer.Option(None, min=1, help="verl/trl: expected samples per group"),
    tau: int = typer.Option(None, min=0, help="verl/trl: staleness bound"),
    trainer_version: int = typer.Option(0, min=0, help="verl/trl: the trainer's version"),
    no_std: bool = typer.Option(False, "--no-std", help="verl/trl: GRPO without std"),
    tokenizer: str = typer.Option(None, help="atif: model folder (or 'bundled') whose "
                                  "tokenizer decodes sampled ids into step messages"),
) -> None:
    """Export trajectories: the pool as JSONL/Parquet, or verl/TRL training rows."""
    target = _export_target(out)
    with _written_whole(target) as partial:
        _export(partial, target, fmt, db, gateway, admin_key, jsonl, group_id, status, window,
                max_groups, group_size, tau, trainer_version, no_std, tokenizer)


def _export_target(out: str) -> Path:
    """The export file, checked before anything is read: exit 2 with the fix otherwise."""
    target = Path(out)
    if target.is_dir():
        _fail(f"--out {out}: is a folder; give a file name, e.g. {target / 'export.jsonl'}")
    if not target.parent.is_dir():
        _fail(f"--out {out}: folder {target.parent} does not exist; create it first "
              f"(mkdir -p {target.parent})")
    if not os.access(target.parent, os.W_OK):
        _fail(f"--out {out}: folder {target.parent} is not writable")
    return target


@contextmanager
def _written_whole(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `target`, moved onto it only when the export finished:
    a failed export leaves no half-written file."""
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        yield partial
        if partial.exists():
            os.replace(partial, target)
    except OSError as e:
        _fail(f"--out {target}: {e.strerror or e}")
    finally:
        partial.unlink(missing_ok=True)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _export(out: Path, target: Path, fmt: str | None, db: str | None, gateway: str | None,
            admin_key: str | None, jsonl: str | None, group_id: str | None,
            status: str | None, window: int | None, max_groups: int | None,
            group_size: int | None, tau: int | None, trainer_version: int,
            no_std: bool, tokenizer: str | None = None) -> None:
    if fmt is None:
        fmt = "verl" if (gateway or jsonl) else "jsonl"
    if fmt in ("verl", "trl"):
        from envhub.trainer.cli import export

        if db is not None and gateway is None and jsonl is None:
            _check_pool_file(db)
        export(out=out, shown_as=target, fmt=fmt, gateway=gateway, admin_key=admin_key, db=db,
               jsonl=Path(jsonl) if jsonl else None, window=window, max_groups=max_groups,
               group_size=group_size, tau=tau, trainer_version=trainer_version, no_std=no_std)
        return
    if fmt not in ("jsonl", "parquet", "atif"):
        typer.echo(f"error: --format {fmt!r}: use jsonl, parquet, verl or trl, or atif", err=True)
        raise typer.Exit(2)
    if db is None:
        typer.echo("error: jsonl/parquet/atif read the pool directly: pass --db URL, e.g. "
                   "--db sqlite:///envhub-pool.db", err=True)
        raise typer.Exit(2)
    _check_pool_file(db)
    from envhub.gateway.pool.export import export_jsonl, export_parquet
    from envhub.gateway.pool.store import Store

    if fmt == "atif":
        from envhub.gateway.pool.atif import tokenizer_decode

        try:
            decode = tokenizer_decode(tokenizer) if tokenizer else None
        except ValueError as e:
            _fail(str(e))
    store = Store(db)
    try:
        if fmt == "atif":
            from envhub.gateway.pool.atif import export_atif

            n, skipped = export_atif(store, Path(out), group_id, status, __version__, decode)
            typer.echo(f"wrote {n} ATIF trajectories to {target} ({skipped} sessions without "
                       "model calls skipped)")
            return
        writer = export_jsonl if fmt == "jsonl" else export_parquet
        n = writer(store, Path(out), group_id, status)
    finally:
        store.close()
    typer.echo(f"wrote {n} {'trajectories' if fmt == 'jsonl' else 'segments'} to {target}")


def _check_pool_file(db: str) -> None:
    if db.startswith("sqlite:///") and not Path(db[len("sqlite:///"):]).is_file():
        _fail(f"{db}: no such pool file")


def _register_all() -> None:
    from envhub import machine_cli
    from envhub.gateway import cli as gateway_cli
    from envhub.orchestrator import cli as orchestrator_cli
    from envhub.orchestrator.audit.cli import audit_for_publish
    from envhub.registry import cli as registry_cli
    from envhub.trainer import cli as trainer_cli
    from envhub.viewer import cli as viewer_cli

    # `envhub publish` audits with the orchestrator's audit: given here, so neither imports
    # the other.
    for register in (gateway_cli.register, orchestrator_cli.register,
                     functools.partial(registry_cli.register, auditor=audit_for_publish),
                     trainer_cli.register, viewer_cli.register, machine_cli.register):
        register(app)


_register_all()


def main() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun rank (--nproc-per-node)
        from envhub.trainer.distributed import run_rank

        run_rank(app)
    app()


if __name__ == "__main__":  # python -m envhub.cli (python -m envhub works too)
    main()
