"""Splitting a document body into chunks of the configured size.

Chunks prefer to end at a paragraph break, then a line break, then a sentence
end, then a space, so a section is not cut mid-word; consecutive chunks overlap
by up to ``overlap`` characters. Offsets index into the original body, so
``body[start:end] == text`` for every chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

_BREAKS = ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ")


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
        next_start = max(end - overlap, start + 1)
        # Start the overlap at a word boundary.
        while next_start < end and not body[next_start - 1].isspace():
            next_start += 1
        start = next_start if next_start < end else end
    return spans
