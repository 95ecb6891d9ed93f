"""One progress bar for the CLI's long-running commands (derive jobs, extraction).

A bar appears only when the console is a terminal, so scripts, tests and logs get
the commands' report lines alone. ``progress_bar`` yields ``update(done, total)``,
the callback the jobs accept as ``on_progress``; ``label`` may be changed on the
way (``update(done, total, label)``), which ``engram derive all`` uses to name the
job that runs now. With ``unit`` the bar also shows the rate (``17.5 chunks/s``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text


class Update(Protocol):
    def __call__(self, done: int, total: int, label: str | None = None) -> None: ...


class RateColumn(TextColumn):
    """Items per second since the task started, e.g. ``17.5 chunks/s``."""

    def __init__(self, unit: str) -> None:
        super().__init__("")
        self.unit = unit

    def render(self, task: Any) -> Text:
        elapsed = task.elapsed or 0.0
        return Text(f"{task.completed / elapsed:.1f} {self.unit}/s" if elapsed > 0 else "")


@contextmanager
def progress_bar(console: Console, label: str, *, unit: str | None = None,
                 transient: bool = True) -> Iterator[Update]:
    """A bar on ``console`` (a no-op callback when it is not a terminal)."""
    if not console.is_terminal:
        def quiet(done: int, total: int, label: str | None = None) -> None:
            return None

        yield quiet
        return
    columns: list[ProgressColumn] = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    if unit is not None:
        columns.append(RateColumn(unit))
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=console, transient=transient) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int, label: str | None = None) -> None:
            if label is None:
                bar.update(task, completed=done, total=total)
            else:
                bar.update(task, completed=done, total=total, description=label)

        yield update
