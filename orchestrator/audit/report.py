"""The audit's table: one row per (sandbox kind, cheat), judged against the no-op of the same
kind. A row is flagged when a cheat beats the no-op's mean reward, escapes into env_failure
where the no-op had none, hangs past the audit's limit or crashes the run; the oracle's row
when it does not solve every task; the no-op's when it scores or fails on its own."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from envhub.orchestrator.audit.battery import NOOP, ORACLE

EPS = 1e-9
MAX_REASONS = 3  # distinct env_failure reasons kept per row
REASON_CHARS = 400


class AuditRow(BaseModel):
    cheat: str
    what: str = ""
    sandbox: str = "none"
    tasks: int = 0  # rollouts (one per task)
    mean_reward: float | None = None  # mean verifier outcome over `done` rollouts
    done: int = 0
    env_failure: int = 0
    agent_error: int = 0
    resolved: int = 0
    timed_out: bool = False  # the run did not finish within the audit's limit
    error: str | None = None  # the run itself raised
    wall_s: float = 0.0
    out: str | None = None  # its run folder
    reasons: list[str] = Field(default_factory=list)  # why rollouts were env_failure (distinct)
    flags: list[str] = Field(default_factory=list)

    @property
    def verdict(self) -> str:
        return ", ".join(self.flags) or "ok"


def row_from_records(cheat: str, what: str, sandbox: str, records: list[Any]) -> AuditRow:
    """A row from a run's RolloutRecords (unjudged)."""
    done = [r for r in records if r.status == "done"]
    outcomes = [float(r.outcome or 0.0) for r in done]
    return AuditRow(cheat=cheat, what=what, sandbox=sandbox, tasks=len(records),
                    mean_reward=sum(outcomes) / len(outcomes) if outcomes else None,
                    done=len(done), resolved=sum(1 for r in done if r.resolved),
                    env_failure=sum(1 for r in records if r.status == "env_failure"),
                    agent_error=sum(1 for r in records if r.status == "agent_error"),
                    reasons=list(dict.fromkeys(
                        (r.reason or "(no reason given)")[:REASON_CHARS]
                        for r in records if r.status == "env_failure"))[:MAX_REASONS])


def judge(rows: list[AuditRow]) -> list[AuditRow]:
    """Set each row's flags (in place) against the no-op row of its sandbox kind; returns rows."""
    noops = {r.sandbox: r for r in rows if r.cheat == NOOP}
    for row in rows:
        row.flags = _flags(row, noops.get(row.sandbox))
    return rows


def _flags(row: AuditRow, noop: AuditRow | None) -> list[str]:
    flags = []
    if row.error:
        flags.append("run failed")
    if row.timed_out:
        flags.append("hung")
    if row.cheat == ORACLE:
        if row.resolved < row.tasks or row.tasks == 0:
            flags.append("oracle unsolved")
        return flags
    if row.cheat == NOOP:
        if row.env_failure:
            flags.append("no-op env_failure")
        if (row.mean_reward or 0.0) > EPS:
            flags.append("no-op scores")
        return flags
    base = (noop.mean_reward or 0.0) if noop is not None else 0.0
    if row.mean_reward is not None and row.mean_reward > base + EPS:
        flags.append("beats no-op")
    if row.env_failure and (noop is None or noop.env_failure == 0):
        flags.append("escaped")
    return flags


def flagged(rows: list[AuditRow]) -> bool:
    return any(r.flags for r in rows)


def explain(rows: list[AuditRow]) -> list[str]:
    """Lines saying why each flagged row's rollouts failed on the environment's side."""
    return [f"{r.cheat} ({r.sandbox}) env_failure: {reason}"
            for r in rows if r.flags for reason in r.reasons]


def render(rows: list[AuditRow], title: str) -> Any:
    """A rich Table of the judged rows."""
    from rich.table import Table

    table = Table(title=title)
    for col, justify in (("cheat", "left"), ("sandbox", "left"), ("tasks", "right"),
                         ("mean reward", "right"), ("done", "right"), ("env_failure", "right"),
                         ("agent_error", "right"), ("wall s", "right"), ("verdict", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        mean = "-" if r.mean_reward is None else f"{r.mean_reward:.3f}"
        verdict = f"[bold red]{r.verdict}[/]" if r.flags else "[green]ok[/]"
        table.add_row(r.cheat, r.sandbox, str(r.tasks), mean, str(r.done), str(r.env_failure),
                      str(r.agent_error), f"{r.wall_s:.0f}", verdict)
    return table
