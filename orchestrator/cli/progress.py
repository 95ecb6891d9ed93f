"""One progress bar for long CLI runs (extraction; ingest's extraction pass).

A bar only on a terminal: scripts, tests and logs get the command's summary line
alone. ``progress_bar`` yields ``update(done, total)``, the callback shape the
jobs take (``on_progress``), and shows the rate per second beside the count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text


class _Rate(TextColumn):
    def __init__(self, unit: str) -> None:
        super().__init__("")
        self.unit = unit

    def render(self, task: Any) -> Text:
        elapsed = task.elapsed or 0.0
        return Text(f"{task.completed / elapsed:.1f} {self.unit}/s" if elapsed > 0 else "")


@contextmanager
def progress_bar(label: str, console: Console, *, unit: str = "chunks",
                 transient: bool = True) -> Iterator[Callable[[int, int], None]]:
    if not console.is_terminal:
        yield lambda done, total: None
        return
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), _Rate(unit), TimeElapsedColumn(),
                  console=console, transient=transient) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
