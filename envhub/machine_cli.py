"""`envhub doctor` and `envhub gc`: check this machine for envhub, and clean up after it."""

from __future__ import annotations

from pathlib import Path

import typer

MARKS = {"ok": "ok", "warn": "WARN", "missing": "MISSING"}


def doctor(
    concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=100_000,
                                    help="rollouts you mean to run at once (file descriptors)"),
    runs: Path = typer.Option(Path("runs"), help="where runs are kept (disk headroom)"),
) -> None:
    """Check Python and the key packages against the lock, docker, bubblewrap, Chromium,
    PostgreSQL, vLLM's venv, GPUs, file descriptors and disk; print the fix for each problem.
    Exit 1 when something is missing, 0 otherwise (warnings included)."""
    from envhub.doctor import checks

    missing = 0
    for check in checks(concurrency, runs):
        missing += check.status == "missing"
        typer.echo(f"{MARKS[check.status]:8} {check.name:17} {check.detail}")
        if check.fix:
            typer.echo(f"{'':8} {'':17} fix: {check.fix}")
    typer.echo(f"\n{missing} missing" if missing else "\nnothing missing")
    raise typer.Exit(1 if missing else 0)


def gc(
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="list, remove nothing"),
    runs: Path = typer.Option(Path("runs"), help="the runs folder whose old runs go"),
    older_than: float = typer.Option(14.0, min=0, max=36500,
                                     help="days since a run was last written"),
) -> None:
    """Remove what envhub left behind: cached agent layers and bundles, base and environment
    images the current version does not use, build caches, runs older than --older-than days,
    and sandboxes whose owner process is gone. Only envhub's own (by its names and labels)."""
    from envhub.gc import leftovers

    found = leftovers(runs, older_than)
    total = sum(item.size for item in found)
    verb = "would remove" if dry_run else "removing"
    typer.echo(f"{verb} {len(found)} item(s), {total / (1 << 20):.0f} MiB")
    failed = 0
    for item in found:
        typer.echo(f"  {item.kind:13} {item.size / (1 << 20):8.1f} MiB  {item.name}  ({item.why})")
        if dry_run:
            continue
        try:
            item.remove()
        except Exception as e:  # noqa: BLE001 - one that cannot go (in use) must not stop the rest
            failed += 1
            typer.echo(f"{'':17}not removed: {e}", err=True)
    if failed:
        typer.echo(f"{failed} item(s) could not be removed (in use?); the rest are gone", err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    app.command("gc")(gc)
