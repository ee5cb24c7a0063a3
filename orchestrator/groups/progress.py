"""What a run shows: a live progress line (rollouts done, mean reward so far, failures) and a
results table per task at the end. Rendering goes to stderr; the table to stdout."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envhub.orchestrator.groups.results import RolloutRecord, summarize


class RunProgress:
    def __init__(self, total: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
            console=self.console, transient=False,
        )
        self.task = self.progress.add_task("rollouts", total=total, stats="")
        self.done = self.resolved = self.env_failure = self.agent_error = 0
        self.reward_sum = 0.0

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.progress.stop()

    def add(self, record: RolloutRecord, resumed: bool = False) -> None:
        if record.status == "done":
            self.done += 1
            self.resolved += int(bool(record.resolved))
            self.reward_sum += record.components.get("total", 0.0)
        elif record.status == "env_failure":
            self.env_failure += 1
        else:
            self.agent_error += 1
        mean = self.reward_sum / self.done if self.done else 0.0
        stats = (f"reward {mean:.3f} · resolved {self.resolved}/{self.done} · "
                 f"env_failure {self.env_failure} · agent_error {self.agent_error}"
                 + (" (resumed)" if resumed else ""))
        self.progress.update(self.task, advance=1, stats=stats)


def results_table(records: list[RolloutRecord]) -> Table:
    """One row per task: samples, resolved, mean outcome / process / time / total over `done`
    rollouts, failures (never averaged in as zeros), and forged test runs caught by the grader."""
    summary = summarize(records)
    table = Table(title="envhub run results")
    table.add_column("env/task", overflow="fold", min_width=24)
    for col in ("n", "solved", "outcome", "process", "time", "total", "env_fail", "agent_err",
                "tampered"):
        table.add_column(col, justify="right", no_wrap=True)

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def row(name: str, b: dict) -> list[str]:
        m = b["mean"]
        return [name, str(b["rollouts"]), f"{b['resolved']}/{b['done']}", fmt(m["outcome"]),
                fmt(m["process"]), fmt(m["time"]), fmt(m["total"]), str(b["env_failure"]),
                str(b["agent_error"]), str(b["tampered"])]

    for name, b in summary["tasks"].items():
        table.add_row(*row(name, b))
    table.add_section()
    for name, b in summary["envs"].items():
        table.add_row(*row(f"[bold]{name}[/bold] (all)", b))
    return table


def table_console() -> Console:
    """stdout console; when not a terminal (logs, CI), wide enough that task ids stay whole."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 140))


def failure_lines(records: list[RolloutRecord], limit: int = 5) -> list[str]:
    """The distinct failure reasons with counts, most frequent first (at most `limit`)."""
    counts: dict[tuple[str, str], int] = {}
    for r in records:
        if r.status != "done":
            key = (r.status, (r.reason or "no reason given").splitlines()[0][:300])
            counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    lines = [f"{n} × {status}: {reason}" for (status, reason), n in ranked[:limit]]
    if len(ranked) > limit:
        lines.append(f"... and {len(ranked) - limit} other reasons (see --out records)")
    return lines
