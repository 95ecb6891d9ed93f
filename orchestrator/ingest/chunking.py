"""Splitting a document body into chunks of the configured size.

Chunks prefer to end at a paragraph break, then a line break, then a sentence
end, then a space, so a section is not cut mid-word; consecutive chunks overlap
by up to ``overlap`` characters, and the overlap starts where a reader would: at
the first paragraph or sentence start in the last ``overlap`` characters of the
chunk before (an excerpt served alone then opens with a whole sentence, not "from
a completed test are marked..."), else at a line start, else at a word. Where the
window's only sentence start is the chunk's end, the chunks touch (no overlap is
better than one that opens mid-sentence). Offsets index into the original
body, so ``body[start:end] == text`` for every chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

_BREAKS = ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ")
# Where an overlap may start: after a paragraph break or a sentence end (best), after a
# line break (Markdown wraps paragraphs, so a line start is often mid-sentence), at a word.
_STARTS = (("\n\n", ". ", "? ", "! ", ".\n", "?\n", "!\n", ":\n"), ("\n",))


def _overlap_start(body: str, lo: int, end: int) -> int:
    """The first paragraph or sentence start in ``body[lo:end]``, else the first line start,
    else the first word start; ``end`` when there is none."""
    for marks in _STARTS:
        found = [i + len(mark) for mark in marks if (i := body.find(mark, lo, end)) != -1]
        found = [i for i in found if i < end]
        if found:
            return min(found)
    while lo < end and not body[lo - 1].isspace():
        lo += 1
    return lo


@dataclass(frozen=True)
class ChunkSpan:
    ordinal: int
    start: int
    end: int
    text: str


def chunk_text(body: str, size: int = 1200, overlap: int = 150) -> list[ChunkSpan]:
    if size <= 0:
        raise ValueError("chunk size must be positive")
    if not 0 <= overlap < size:
        raise ValueError("chunk overlap must be at least 0 and smaller than the chunk size")
    spans: list[ChunkSpan] = []
    n = len(body)
    start = 0
    while start < n:
        # Skip leading whitespace so no chunk starts blank.
        while start < n and body[start].isspace():
            start += 1
        if start >= n:
            break
        end = min(start + size, n)
        if end < n:
            window = body[start:end]
            floor = len(window) // 2
            for mark in _BREAKS:
                cut = window.rfind(mark, floor)
                if cut != -1:
                    end = start + cut + len(mark)
                    break
        text = body[start:end].rstrip()
        if text:
            spans.append(ChunkSpan(len(spans), start, start + len(text), text))
        if end >= n:
            break
        start = _overlap_start(body, max(end - overlap, start + 1), end) if overlap else end
    return spans
