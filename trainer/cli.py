"""`envhub` commands owned by the trainer component (heavy imports stay inside commands)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add this component's commands to the top-level app. (`export` is wired by
    envhub/cli.py, which also serves the pool's own jsonl/parquet formats.)"""


def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="Parquet file to write.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="verl | trl")] = "verl",
    gateway: Annotated[str | None, typer.Option(
        "--gateway", help="Gateway base URL to read the pool from.")] = None,
    admin_key: Annotated[str | None, typer.Option(
        "--admin-key", envvar="ENVHUB_ADMIN_KEY", help="The gateway's admin key.")] = None,
    jsonl: Annotated[Path | None, typer.Option(
        "--jsonl", help="Read trajectories from a JSONL file instead of a gateway.")] = None,
    db: Annotated[str | None, typer.Option(
        "--db", help="Read the pool directly (sqlite:///FILE or postgresql://...).")] = None,
    window: Annotated[int | None, typer.Option(
        "--window", min=1, help="Windowed-FIFO size; default: every finished group.")] = None,
    max_groups: Annotated[int | None, typer.Option("--max-groups", min=1)] = None,
    group_size: Annotated[int | None, typer.Option(
        "--group-size", min=1, help="Expected samples per group (padding/drop).")] = None,
    tau: Annotated[int | None, typer.Option(
        "--tau", min=0, help="Staleness bound (with --trainer-version).")] = None,
    trainer_version: Annotated[int, typer.Option("--trainer-version", min=0)] = 0,
    no_std: Annotated[bool, typer.Option(
        "--no-std", help="GRPO without std normalisation.")] = False,
    shown_as: Path | None = None,
) -> None:
    """Export finished groups as Parquet for verl (padded tensors in its batch layout) or TRL
    (rows its GRPOTrainer replays): ids, masks, rollout logprobs, per-token advantages."""
    from envhub.trainer.config import TrainerConfig
    from envhub.trainer.errors import TrainerError
    from envhub.trainer.export import export_parquet
    from envhub.trainer.source import HttpSource, InMemorySource, StoreSource, TrajectorySource

    if fmt not in ("verl", "trl"):
        raise typer.BadParameter(f"{fmt!r}: use --format verl or --format trl",
                                 param_hint="--format")
    if sum(x is not None for x in (gateway, jsonl, db)) != 1:
        raise typer.BadParameter("give exactly one of --gateway URL, --jsonl FILE or --db URL",
                                 param_hint="--gateway/--jsonl/--db")
    if jsonl is not None and not jsonl.is_file():
        raise typer.BadParameter(f"{jsonl} does not exist", param_hint="--jsonl")
    config = TrainerConfig.model_validate({
        "filters": {"tau": tau, "group_size": group_size},
        "advantages": {"normalize_std": not no_std}})
    try:
        source: TrajectorySource
        if jsonl is not None:
            source = InMemorySource.from_jsonl(jsonl)
        elif db is not None:
            source = StoreSource(db)
        else:
            source = HttpSource(gateway or "", admin_key or os.environ.get("ENVHUB_ADMIN_KEY"))
        try:
            metrics = export_parquet(source, out, fmt,  # type: ignore[arg-type]
                                     config=config, trainer_version=trainer_version,
                                     window=window, max_groups=max_groups)
        finally:
            if isinstance(source, (HttpSource, StoreSource)):
                source.close()
    except TrainerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"wrote {int(metrics['batch/sequences'])} sequences from "
               f"{int(metrics['batch/groups'])} groups to {shown_as or out}")
    dropped = {k: v for k, v in metrics.items() if k.startswith("drop") and v}
    if dropped:
        typer.echo("dropped: " + ", ".join(f"{k}={int(v)}" for k, v in sorted(dropped.items())))
