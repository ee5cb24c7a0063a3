"""What `envhub train` shows while it runs: on a terminal, a live progress line under the log
(step N/M, the last reward and eval, rollouts in flight, trained tokens/s, staleness drops so
far, the time left), through rich as `envhub run`'s is; not on a terminal (logs, CI), the plain
lines alone; with `-q`, neither (errors still go to stderr)."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainConsole:
    def __init__(self, steps: int, *, quiet: bool = False, console: Console | None = None
                 ) -> None:
        self.console = console or Console()
        self.quiet = quiet
        self.live = not quiet and self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TextColumn("left"),
            TimeRemainingColumn(), console=self.console, transient=False)
        self.task = self.progress.add_task("train", total=steps, stats="starting")
        self.eval: str = "-"
        self.stale = 0.0

    def __enter__(self) -> Self:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.live:
            self.progress.stop()

    def log(self, line: str) -> None:
        """A line of the run's log: above the progress line on a terminal."""
        if self.quiet:
            return
        if self.live:
            self.progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, flush=True)

    def row(self, row: dict[str, Any]) -> None:
        """A metrics row was written: move the progress line on."""
        if row.get("phase") == "eval":
            self.eval = f"{row.get('eval/resolved_rate', 0.0):.2f}"
            return
        self.stale += float(row.get("filter/stale", 0.0))
        tokens, train_s = row.get("trainer/tokens/packed", 0.0), row.get("train_s", 0.0)
        rate = f"{tokens / train_s:,.0f}" if train_s else "-"
        stats = (f"reward {row.get('reward_mean', 0.0):+.3f} · resolved "
                 f"{row.get('resolved_rate', 0.0):.2f} · eval {self.eval} · in flight "
                 f"{row.get('in_flight', 0)} · {rate} tok/s · stale {int(self.stale)} · "
                 f"v{row.get('weight_version', 0)}")
        self.progress.update(self.task, completed=int(row.get("step", 0)) + 1, stats=stats)
