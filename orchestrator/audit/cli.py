"""`envhub audit ENV`: the battery against one environment, a table, an exit status.

Exit 0: nothing flagged; 1: a cheat beat the no-op, escaped into env_failure or hung, or the
oracle failed a task; 2: bad input (unknown environment, bad option), with the fix.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

FLAGGED, BAD_INPUT = 1, 2


def audit_command(
    env: str = typer.Argument(..., help="Built-in name, ./folder or owner/name@version (as "
                              "`envhub run` takes it)."),
    tasks: int = typer.Option(2, "--tasks", "-t", min=1, max=1000, help="Audit on the first N "
                              "tasks (one rollout per cheat and task)."),
    sandbox: Annotated[list[str] | None, typer.Option(
        "--sandbox", "-s", help="Sandbox kind to audit in (repeatable; default: the "
        "manifest's choice).")] = None,
    cheat: Annotated[list[str] | None, typer.Option(
        "--cheat", help="Only this cheat (repeatable; the no-op and the oracle always "
        "run).")] = None,
    parallel: int = typer.Option(2, "--parallel", "-j", min=1, max=64, help="Cheat runs in "
                                 "flight after the no-op."),
    timeout: float = typer.Option(900.0, "--timeout", min=1, help="Seconds one cheat's run may "
                                  "take before it is stopped and flagged hung."),
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for each cheat's run "
                                             "(default: runs/audit-<env>-<time>/).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the table as JSON here "
                                                   "(env, version, digest, envhub version, "
                                                   "date), for `envhub publish`.")] = None,
) -> None:
    """Attack an environment with generic cheating agents beside a no-op and the oracle; flag
    any cheat that beats the no-op or escapes into env_failure (exit 1)."""
    import asyncio

    from rich.console import Console

    from envhub.orchestrator.audit import AuditConfig, audit, explain, flagged, render
    from envhub.orchestrator.console import cancellable, describe, fail, user_errors

    if out is not None and out.exists() and any(out.iterdir()):
        fail(f"--out {out} is not empty; choose a new folder")
    folder = out or Path("runs") / time.strftime(
        f"audit-{Path(env).name.replace('@', '-')}-%Y%m%d-%H%M%S", time.gmtime())
    config = AuditConfig(env=env, out=folder, tasks=tasks, sandboxes=_kinds(sandbox),
                         cheats=list(cheat or []), parallel=parallel, cheat_timeout_s=timeout)

    def progress(row: Any) -> None:
        typer.echo(f"  {row.cheat} ({row.sandbox}): {row.done}/{row.tasks} done, "
                   f"{row.wall_s:.0f} s", err=True)

    typer.echo(f"audit {env}: runs go to {folder}/", err=True)
    try:
        report = asyncio.run(cancellable(audit(config, on_row=progress)))
    except user_errors() as e:
        fail(describe(e))
    except (KeyboardInterrupt, asyncio.CancelledError):
        typer.echo("interrupted; each run cleaned up its sandboxes", err=True)
        raise typer.Exit(130) from None
    Console(width=160).print(render(report.rows, f"envhub audit {report.env} "
                                    f"{report.version}  ({report.wall_s:.0f} s)"))
    for line in explain(report.rows):
        typer.echo(line)
    if json_path is not None:
        write_json(report, json_path)
    bad = flagged(report.rows)
    typer.echo(f"{sum(1 for r in report.rows if r.flags)} rows flagged" if bad
               else "nothing flagged: no cheat beat the no-op or escaped; the oracle solved all")
    raise typer.Exit(FLAGGED if bad else 0)


def _kinds(sandbox: list[str] | None) -> list[str | None]:
    """--sandbox values; none given: [None], the manifest's choice."""
    return list(sandbox) if sandbox else [None]


def write_json(report: Any, path: Path) -> None:
    """The audit as JSON: what `envhub publish` records beside a version."""
    import json
    from datetime import UTC, datetime

    from envhub import __version__

    data = {"env": report.env, "version": report.version, "digest": report.digest,
            "envhub_version": __version__, "date": datetime.now(UTC).isoformat(),
            "wall_s": round(report.wall_s, 3),
            "flagged": any(r.flags for r in report.rows),
            "rows": [{**r.model_dump(mode="json"), "verdict": r.verdict} for r in report.rows]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def register(app: typer.Typer) -> None:
    app.command("audit")(audit_command)


async def audit_for_publish(tree: Path, digest: str, out: Path, tasks: int,
                            timeout_s: float) -> Path:
    """`envhub publish`'s audit (registry/cli.py's Auditor): the battery on the unpacked
    package, its report written as `envhub audit --json` writes it; returns that file."""
    from envhub.orchestrator.audit import AuditConfig, audit

    report = await audit(AuditConfig(env=str(tree), out=out, tasks=tasks,
                                     cheat_timeout_s=timeout_s))
    report.digest = digest  # the audited tree is this archive, unpacked
    write_json(report, out / "audit.json")
    return out / "audit.json"
