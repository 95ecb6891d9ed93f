"""The CLI's consoles: what a command prints is printed as it is.

Rich reads ``[word ...]`` in a printed string as markup and drops it, so an excerpt
holding ``register("x", lambda p: [p.gql(...)])`` or ``[bold]`` printed changed: the
prompt-ready string ``engram recall`` printed was not the one recall rendered. Every
console of the CLI has markup (and highlighting) off; a coloured label is a ``Text``
made by ``styled``, and the rest of the line is never parsed.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text


def console(*, stderr: bool = False) -> Console:
    """A console that prints strings verbatim (no markup, no highlighting, no wrapping)."""
    return Console(stderr=stderr, markup=False, highlight=False, soft_wrap=True)


def styled(label: str, style: str, rest: str = "") -> Text:
    """``label`` in ``style``, then ``rest`` exactly as given (a message, a path, user text)."""
    return Text.assemble((label, style), rest)
