"""The CLI's consoles: what a command prints is printed as it is, and nothing it prints can
drive the terminal.

Rich reads ``[word ...]`` in a printed string as markup and drops it, so an excerpt
holding ``register("x", lambda p: [p.gql(...)])`` or ``[bold]`` printed changed: the
prompt-ready string ``engram recall`` printed was not the one recall rendered. Rich also
reads ``:x:`` as an emoji code: ``/etc/passwd``'s ``root:x:0:0`` printed as ``root❌0:0``, a
Slack export's ``:tada:`` as the emoji. Every console of the CLI has markup, emoji codes
(and highlighting) off; a coloured label is a ``Text``
made by ``styled``, and the rest of the line is never parsed.

Printed text is other people's text too (an excerpt, a fact, a title): a document holding
``ESC [2J`` or ``ESC ]0;...BEL`` would clear the reader's screen or retitle the window when
``engram recall`` printed it. On a terminal, control characters other than tab and line
breaks are shown as their pictures (ESC as ``U+241B``); into a pipe or a file the bytes are written as
they are, so a program reading the output gets exactly what recall rendered.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from orchestrator.inputs import CONTROL_CHARACTERS

# C0 controls but tab and newline (a carriage return only before a newline), DEL and C1.
# ... and the bidirectional overrides and isolates, which reorder what a terminal shows
# ("Trojan Source": a title that displays as another).
_CONTROL = re.compile(r"\r(?!\n)|[\u202a-\u202e\u2066-\u2069]|" + CONTROL_CHARACTERS)


def _picture(match: re.Match[str]) -> str:
    """The control character's Unicode picture (U+241B for ESC), one character for one: the
    styled spans of a ``Text`` keep their places."""
    code = ord(match.group(0))
    return chr(0x2400 + code) if code < 0x20 else "\u2421" if code == 0x7F else "\ufffd"  # C1, bidi


def printable(text: str) -> str:
    """``text`` with every control character that could act on a terminal shown as its
    picture (ESC as U+241B), same length."""
    return _CONTROL.sub(_picture, text)


class VerbatimConsole(Console):
    """Rich's console, printing strings verbatim; on a terminal, their control characters as
    pictures (``printable``)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if self.is_terminal:
            objects = tuple(printable(o) if isinstance(o, str) else _printable_text(o)
                            if isinstance(o, Text) else o for o in objects)
        super().print(*objects, **kwargs)


def _printable_text(text: Text) -> Text:
    if not _CONTROL.search(text.plain):
        return text
    out = text.copy()
    out.plain = printable(text.plain)
    return out


def echo_plain(line: str) -> None:
    """``line`` as is, tabs kept (for scripts that cut columns); on a terminal through
    ``printable``."""
    typer.echo(printable(line) if sys.stdout.isatty() else line)


def console(*, stderr: bool = False) -> Console:
    """A console that prints strings verbatim (no markup, no emoji codes, no highlighting, no
    wrapping)."""
    return VerbatimConsole(stderr=stderr, markup=False, emoji=False, highlight=False,
                           soft_wrap=True)


def styled(label: str, style: str, rest: str = "") -> Text:
    """``label`` in ``style``, then ``rest`` exactly as given (a message, a path, user text)."""
    return Text.assemble((label, style), rest)


def exit_status(exc: BaseException | str | None) -> int:
    """A failed command's exit status: 2 when a value given was refused (an ``EngramError``
    of code ``BAD_USER_INPUT``, or that code from the API: the command line can be fixed),
    1 for anything else (not found, conflicts, an unavailable database)."""
    code = exc if isinstance(exc, str) or exc is None else getattr(exc, "code", None)
    return 2 if code == "BAD_USER_INPUT" else 1
