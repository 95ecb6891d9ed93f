"""Splitting a document body into chunks of the configured size.

A chunk that opens the document or a heading ends before the last heading in the last two
thirds of its size, so a section starts a chunk with its heading (an API reference's "####
`filehandle.readLines()`" with its text and example, not that example at the head of the
next section's chunk); a chunk that goes on with a section from the chunk before ends before
the first heading there, with the section it goes on with (the next section's heading, "###
Ownership Rules", opens the next chunk instead of ending one of "The Stack and the Heap");
the next chunk starts there, with no overlap; where headings stand over that heading with nothing
of their own (a changelog's anchor and "## Version 20.5.0" over "### Notable Changes"), the
chunk ends before them. Without such a heading, chunks prefer to end at
a paragraph break, then the end of a sentence or of a block's line (a line ending in a full
stop or colon, a line before a list item, quote, table row, heading, fence or link reference
definition: ``markdown.LINE_END``), then any line
break, then a clause's or a word's end, so a section is not cut mid-word, and never inside a
fenced code block while a cut outside one is in the window's second half (or before the
block, when it fills that half). Markdown wraps paragraphs, so most line breaks are
mid-sentence: a chunk that ended at one opened the next mid-sentence ("current version of a
row the asker can see, seals the receipt ...", stop 50). Consecutive chunks overlap by up to
``overlap`` characters, and the overlap starts where a reader would: at the first paragraph,
sentence or block-line start in the last ``overlap`` characters of the chunk before (an
excerpt served alone then opens with a whole sentence, not "from a completed test are
marked..."). Where there is none and the chunk ends a sentence, the chunks touch (no overlap
is better than one that opens mid-sentence); only a chunk that itself ends mid-sentence
overlaps from a line start, else a word. Offsets index into the original body, so
``body[start:end] == text`` for every chunk.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from orchestrator.markdown import (
    LINE_END,
    MARKER_LINE,
    SETEXT_UNDERLINE,
    code_fences,
    enclosing,
    ordered_marker,
    section_starts,
)

# Where a chunk may end, best first; within a tier, at the last such place in reach. A match's
# end is the cut. Tier 1: a line a reader reads as one ends (``LINE_END``: a sentence's or a
# colon's line, a line before a list item, quote, table row, heading, fence or link reference
# definition), or a sentence inside a line. Tier 2: any line break (mid-sentence in a wrapped
# paragraph).
_TIERS = tuple(re.compile(p, re.MULTILINE) for p in (
    r"\n\n",
    LINE_END + r"|[.?!] ",
    r"\n",
    r"; ",
    r", ",
    r" ",
))
_LOOKAHEAD = 16  # characters past a window a tier's lookahead may read


def _cuts(body: str, tier: re.Pattern[str], lo: int, hi: int) -> list[int]:
    """Where ``tier`` lets a chunk end in ``body[lo:hi]`` (a match's end), in order; an
    ordered list's marker ends no sentence."""
    return [m.end() for m in tier.finditer(body, lo, min(hi + _LOOKAHEAD, len(body)))
            if m.end() <= hi and not (m.group().endswith(" ") and ordered_marker(body, m.start()))]


def _clean_end(body: str, end: int) -> bool:
    """Whether a chunk ending at ``end`` ends a paragraph, a sentence or a block's line."""
    return any(end in _cuts(body, tier, max(end - 4, 0), end) for tier in _TIERS[:2])


def _overlap_start(body: str, lo: int, end: int) -> int:
    """The first paragraph, sentence or block-line start in ``body[lo:end]``; ``end`` (no
    overlap) when there is none and the chunk ends cleanly; else the first line start,
    else the first word start (``end`` when there is none). An ordered list's marker ("1. ")
    ends no sentence: Node.js's commit-queue guide had a chunk open with "Push the changes
    to nodejs/node", the rest of "      1. Push the changes ..." (stop 45)."""
    found = [at for tier in _TIERS[:2] for at in _cuts(body, tier, lo, end) if at < end]
    if found:
        return min(found)
    if _clean_end(body, end):
        return end
    found = [at for at in _cuts(body, _TIERS[2], lo, end) if at < end]
    if found:
        return found[0]
    while lo < end and not body[lo - 1].isspace():
        lo += 1
    return lo


@dataclass(frozen=True)
class ChunkSpan:
    ordinal: int
    start: int
    end: int
    text: str


def _last_break(body: str, lo: int, hi: int, fences: list[tuple[int, int]]) -> int | None:
    """Where a chunk ending in ``body[lo:hi]`` ends best (the last place of the first of
    ``_TIERS`` found there), never inside one of ``fences``; None when nowhere."""
    for tier in _TIERS:
        for cut in reversed(_cuts(body, tier, lo, hi)):
            if enclosing(cut, fences) is None:
                return cut
    return None


def _cut(body: str, start: int, limit: int, sections: list[int],
         fences: list[tuple[int, int]]) -> tuple[int, bool]:
    """Where the chunk from ``start`` that may run to ``limit`` ends, and whether a section
    starts there."""
    size = limit - start
    first = bisect.bisect_right(sections, start + size // 3)
    last = bisect.bisect_right(sections, limit) - 1
    if first <= last:
        # A chunk that opens a section packs whole sections (an API reference's short ones)
        # and ends before the last heading; one that goes on with a section from the chunk
        # before ends with that section, before the first: its heading opens the next chunk
        # ("### Ownership Rules" was the end of a chunk of "The Stack and the Heap").
        i = last if _opens_section(body, start, sections) else first
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


_TEXT = re.compile(r"\S")


def _opens_section(body: str, start: int, sections: list[int]) -> bool:
    """Whether the chunk from ``start`` opens the document or a heading (after blank or
    marker lines): it goes on with nothing from a chunk before."""
    if _TEXT.search(body, 0, start) is None:  # nothing before it (no slice: once per chunk)
        return True
    i = bisect.bisect_left(sections, start)
    if i == len(sections):
        return False
    return all(not line.strip() or MARKER_LINE.fullmatch(line)
               for line in body[start:sections[i]].splitlines())


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
