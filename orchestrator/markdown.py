"""Markdown structure that ingest and recall both read: fenced code blocks and where sections
start. Offsets index into the text given; nothing here changes it."""

from __future__ import annotations

import bisect
import re

# A fenced code block (CommonMark): its opening backticks or tildes after up to three
# spaces, to a closing fence of that character at least as long, or the end of the text.
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*(?:\n.*?^ {0,3}\1[`~]*[ \t]*$|.*\Z)",
                    re.MULTILINE | re.DOTALL)
# An ATX heading's line: one to six "#" after up to three spaces, then a space, a tab or
# the line's end ("#hashtag" is no heading).
_ATX = re.compile(r"^ {0,3}#{1,6}(?=[ \t]|$)", re.MULTILINE)
# A setext heading's underline: "=" or "-" only (after up to three spaces), under one line
# of text that follows a blank line or opens the text.
_UNDERLINE = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$", re.MULTILINE)
# A text line that cannot be a setext heading's text (a list item, a quote, a table row,
# an ATX heading): "-" under such a line is a list or a thematic break.
_NOT_SETEXT_TEXT = re.compile(r"[ \t]*(?:[-*+>|#]|\d+[.)])")


def code_fences(text: str) -> list[tuple[int, int]]:
    """(start, end) of each fenced code block of ``text``, from its opening backticks or
    tildes (after up to three spaces) to its closing fence or the end of the text."""
    return [(m.start() + len(m.group()) - len(m.group().lstrip()), m.end())
            for m in _FENCE.finditer(text)]


def inside(position: int, spans: list[tuple[int, int]]) -> bool:
    """Whether ``position`` lies strictly inside one of ``spans`` (sorted, not overlapping):
    a cut there would split it."""
    i = bisect.bisect_right(spans, (position, position)) - 1  # the last one starting before
    return i >= 0 and spans[i][0] < position < spans[i][1]


def section_starts(text: str, fences: list[tuple[int, int]] | None = None) -> list[int]:
    """Sorted offsets of the line starts of ``text``'s headings outside fenced code blocks
    (``fences``: ``code_fences(text)``, computed when not given): ATX headings ("## Usage")
    and setext ones (the line of text above a "===" or "---" underline)."""
    fences = code_fences(text) if fences is None else fences
    starts = [m.start() for m in _ATX.finditer(text) if not inside(m.start(), fences)]
    for m in _UNDERLINE.finditer(text):
        if m.start() < 2 or inside(m.start(), fences):
            continue
        line_start = text.rfind("\n", 0, m.start() - 1) + 1
        line = text[line_start:m.start() - 1]
        if not line.strip() or _NOT_SETEXT_TEXT.match(line):
            continue
        if line_start == 0 or not text[text.rfind("\n", 0, line_start - 1) + 1:line_start - 1].strip():
            starts.append(line_start)
    return sorted(set(starts))
