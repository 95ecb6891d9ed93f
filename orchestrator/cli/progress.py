"""One progress bar for the CLI's long-running commands (derive jobs).

A bar appears only when the console is a terminal, so scripts and logs get the
commands' report lines alone. ``progress_bar`` yields ``update(done, total)``,
the callback the derive jobs accept as ``on_progress``; ``label`` may be
changed on the way (``update(done, total, label)``), which ``engram derive all``
uses to name the job that runs now.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Update(Protocol):
    def __call__(self, done: int, total: int, label: str | None = None) -> None: ...


@contextmanager
def progress_bar(console: Console, label: str) -> Iterator[Update]:
    """A transient bar on ``console`` (a no-op callback when it is not a terminal)."""
    if not console.is_terminal:
        def quiet(done: int, total: int, label: str | None = None) -> None:
            return None

        yield quiet
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True)
    with bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int, label: str | None = None) -> None:
            if label is None:
                bar.update(task, completed=done, total=total)
            else:
                bar.update(task, completed=done, total=total, description=label)

        yield update
