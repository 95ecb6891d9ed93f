"""Splitting a document body into chunks of the configured size.

A chunk ends before the last heading in the last two thirds of its size, so a section
starts a chunk with its heading (an API reference's "#### `filehandle.readLines()`" with
its text and example, not that example at the head of the next section's chunk), and the
next chunk starts there, with no overlap; where headings stand over that heading with nothing
of their own (a changelog's anchor and "## Version 20.5.0" over "### Notable Changes"), the
chunk ends before them. Without such a heading, chunks prefer to end at
a paragraph break, then a line break, then a sentence end, then a space, so a section is
not cut mid-word, and never inside a fenced code block while a cut outside one is in the
window's second half (or before the block, when it fills that half); consecutive chunks overlap
by up to ``overlap`` characters, and the overlap starts where a reader would: at
the first paragraph or sentence start in the last ``overlap`` characters of the
chunk before (an excerpt served alone then opens with a whole sentence, not "from
a completed test are marked..."), else at a line start, else at a word. Where the
window's only sentence start is the chunk's end, the chunks touch (no overlap is
better than one that opens mid-sentence). Offsets index into the original
body, so ``body[start:end] == text`` for every chunk.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from orchestrator.markdown import (
    MARKER_LINE,
    SETEXT_UNDERLINE,
    code_fences,
    enclosing,
    section_starts,
)

_BREAKS = ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ")
# Where an overlap may start: after a paragraph break or a sentence end (best), after a
# line break (Markdown wraps paragraphs, so a line start is often mid-sentence), at a word.
_STARTS = (("\n\n", ". ", "? ", "! ", ".\n", "?\n", "!\n", ":\n"), ("\n",))
# What stands before the full stop of an ordered list's marker on its line ("   2. Leave").
_ORDERED_MARKER = re.compile(r"[ \t]*\d{1,9}")


def _overlap_start(body: str, lo: int, end: int) -> int:
    """The first paragraph or sentence start in ``body[lo:end]``, else the first line start,
    else the first word start; ``end`` when there is none. An ordered list's marker ("1. ")
    ends no sentence: Node.js's commit-queue guide had a chunk open with "Push the changes
    to nodejs/node", the rest of "      1. Push the changes ..." (stop 45)."""
    for marks in _STARTS:
        found = [at for mark in marks if (at := _mark_end(body, mark, lo, end)) is not None]
        if found:
            return min(found)
    while lo < end and not body[lo - 1].isspace():
        lo += 1
    return lo


def _mark_end(body: str, mark: str, lo: int, end: int) -> int | None:
    """Where the first ``mark`` in ``body[lo:end]`` that is no list marker ends, if before
    ``end``."""
    i = body.find(mark, lo, end)
    while i != -1 and mark[0] == "." and _ORDERED_MARKER.fullmatch(
            body, body.rfind("\n", 0, i) + 1, i):
        i = body.find(mark, i + 1, end)
    return i + len(mark) if i != -1 and i + len(mark) < end else None


@dataclass(frozen=True)
class ChunkSpan:
    ordinal: int
    start: int
    end: int
    text: str


def _last_break(body: str, lo: int, hi: int, fences: list[tuple[int, int]]) -> int | None:
    """Where a chunk ending in ``body[lo:hi]`` ends best (after the first of ``_BREAKS``
    found there, the last one), never inside one of ``fences``; None when nowhere."""
    for mark in _BREAKS:
        at = hi
        while (cut := body.rfind(mark, lo, at)) != -1:
            block = enclosing(cut + len(mark), fences)
            if block is None:
                return cut + len(mark)
            at = block[0]  # on before the block: a break ending at its fence or earlier
    return None


def _cut(body: str, start: int, limit: int, sections: list[int],
         fences: list[tuple[int, int]]) -> tuple[int, bool]:
    """Where the chunk from ``start`` that may run to ``limit`` ends, and whether a section
    starts there."""
    size = limit - start
    i = bisect.bisect_right(sections, limit) - 1
    if i >= 0 and sections[i] > start + size // 3:
        return _run_start(body, start, sections, i), True
    end = _last_break(body, start + size // 2, limit, fences)
    if end is not None:
        return end, False
    # The window's second half is inside one code block: end before it where that leaves a
    # quarter of the size, else cut the block at a line (as any over-long text is cut).
    block = enclosing(limit, fences)
    if block is not None and block[0] > start + size // 4:
        return block[0], False
    end = _last_break(body, start + size // 2, limit, [])
    return (limit if end is None else end), False


def _heads_only(body: str, lo: int, hi: int) -> bool:
    """Whether ``body[lo:hi]`` (one section: its heading's first line at ``lo``) is a heading
    and nothing else but blank or marker lines."""
    lines = body[lo:hi].splitlines()
    # A setext heading is its paragraph line and its underline; an ATX heading one line.
    lines = lines[2:] if len(lines) > 1 and SETEXT_UNDERLINE.fullmatch(lines[1]) else lines[1:]
    return all(not line.strip() or MARKER_LINE.fullmatch(line) for line in lines)


def _run_start(body: str, start: int, sections: list[int], i: int) -> int:
    """Where a chunk ending before the section ``sections[i]`` ends: before the headings
    right above it that head nothing of their own ("## 2023-07-18, Version 20.5.0" over
    "### Notable Changes": the version's heading opens the next chunk, not ends this one),
    and before the marker lines above those (a changelog's ``<a id="20.5.0"></a>``), while
    that leaves the chunk some text."""
    cut = sections[i]
    while i > 0 and sections[i - 1] > start and _heads_only(body, sections[i - 1], sections[i]):
        i -= 1
        cut = sections[i]
    while True:
        above = body.rfind("\n", start, max(cut - 1, start))
        line = body[above + 1:cut].rstrip("\n")
        if above < start or not (not line.strip() or MARKER_LINE.fullmatch(line)):
            break
        if not body[start:above].strip():
            break
        cut = above + 1
    return cut


def chunk_text(body: str, size: int = 1200, overlap: int = 150) -> list[ChunkSpan]:
    if size <= 0:
        raise ValueError("chunk size must be positive")
    if not 0 <= overlap < size:
        raise ValueError("chunk overlap must be at least 0 and smaller than the chunk size")
    spans: list[ChunkSpan] = []
    n = len(body)
    fences = code_fences(body)
    sections = section_starts(body, fences)
    start = 0
    while start < n:
        # Skip leading whitespace so no chunk starts blank.
        while start < n and body[start].isspace():
            start += 1
        if start >= n:
            break
        end, section = min(start + size, n), False
        if end < n:
            end, section = _cut(body, start, end, sections, fences)
        text = body[start:end].rstrip()
        if text:
            spans.append(ChunkSpan(len(spans), start, start + len(text), text))
        if end >= n:
            break
        if section or not overlap:
            start = end  # a section opens the next chunk: no overlap into it
            continue
        lo = max(end - overlap, start + 1)
        start = _overlap_start(body, lo, end)
        block = enclosing(start, fences)
        if block is not None:  # an overlap opens at a code block's fence, never inside it
            start = block[0] if block[0] >= lo else end
    return spans
