"""The item the budget cut stops at, cut to the part of it that fits.

``tail.budget_cut`` keeps the longest prefix of the order whose rendering fits the
budget. A source chunk is up to ``chunk_size_chars`` long (1,200 characters, some 300
tokens), so a small budget served nothing at all when the best item was one long chunk
(a 200-token budget over a vault of notes: an empty string), and a large one left the
room after its last whole item unused. ``fit_next`` cuts the next item, a source
excerpt, to its run of sentences that holds the most of the question's terms and fits
the room the prefix leaves (at least ``MIN_ROOM_TOKENS``), verified on the rendered
string like the cut itself, so the result never exceeds the budget. Only the next item,
so the serving order holds; only source excerpts, whose ``char_start``/``char_end`` then
still locate the text in the document's body (``body[char_start:char_end]``). The item
is marked ``clipped`` and its header says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from orchestrator.markdown import (
    BLOCK_LINE,
    SETEXT_UNDERLINE,
    code_fences,
    ordered_marker,
    title_line,
)
from orchestrator.recall.features import terms
from orchestrator.recall.render import Prefixes
from orchestrator.recall.result import Evidence
from orchestrator.recall.tail import part_of, token_cost

# Less room than this is left unused: a part of a few words is no evidence.
MIN_ROOM_TOKENS = 24

# Where a part may start or end: after a sentence's end, or at a line a reader reads as a
# line of its own (a list item, heading, table row: ``_lines``).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_BLOCK_LINE = re.compile(BLOCK_LINE, re.MULTILINE)
# A line that ends where a reader ends reading it: a sentence's end or a clause-opening colon,
# closing quotes or emphasis after it.
_LINE_ENDS = re.compile(r"[.?!:][\"')\]*_`]{0,2}[ \t]*$")


# A fence's line, opening or closing a code block.
_FENCE_LINE = re.compile(r"[ \t]*(?:```|~~~)")
# An ATX heading's line ("## Action items").
_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)", re.MULTILINE)


def _lines(text: str) -> list[tuple[int, int]]:
    """(start, end) of each run of lines a reader reads as one: a paragraph's lines join up
    (Markdown wraps a paragraph, so a line start is mostly mid-sentence: a part that opened at
    one read "current version of a row the asker can see, ...", stop 50); a blank line, a
    block's line (``BLOCK_LINE``: a list item, quote, table row, heading, fence), a line
    after a heading (ATX or setext) or a fence, and a line after one that ends a sentence or
    a colon start a run."""
    runs: list[tuple[int, int]] = []
    at, joins = 0, False
    for line in text.splitlines(keepends=True):
        start, end = at, at + len(line.rstrip("\r\n"))
        at += len(line)
        if not line.strip():
            joins = False
            continue
        if joins and not _BLOCK_LINE.match(text, start):
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((start, end))
        joins = not (_HEADING.match(text, start) or _FENCE_LINE.match(text, start)
                     or _LINE_ENDS.search(text, max(start, end - 16), end)
                     or SETEXT_UNDERLINE.fullmatch(text, start, end))
    return runs


def parts(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence or line of ``text`` (``_lines``), surrounding blanks
    left out; a fenced code block is one part (a part never opens a fence it does not
    close)."""
    pieces = []
    for lo, hi in _lines(text):
        at = lo
        for m in [*_SENTENCE_END.finditer(text, lo, hi), None]:
            # An ordered list's marker ("1. ") ends no sentence: the item is one part with it,
            # so a numbered task item ("1. [ ] Renew the lease") keeps the checkbox that gives
            # it its words.
            if m is not None and ordered_marker(text, m.start() - 1):
                continue
            end = hi if m is None else m.start()
            piece = text[at:end]
            if piece.strip():
                lead = len(piece) - len(piece.lstrip())
                pieces.append((at + lead, at + len(piece.rstrip())))
            if m is not None:
                at = m.end()
    out: list[tuple[int, int]] = []
    fences = code_fences(text)
    for start, end in pieces:
        for a, b in fences:
            if a < end and start < b:  # a piece of a code block stands for the whole block
                start, end = min(start, a), max(end, b)
        while out and out[-1][1] > start:  # one part with the parts it overlaps
            first, last = out.pop()
            start, end = min(start, first), max(end, last)
        out.append((start, end))
    return out


def _heads(text: str, start: int, end: int) -> bool:
    """Whether the part ``text[start:end]`` heads what follows it: an ATX heading, or a whole
    line over a blank line (or at the text's end) that reads as a title
    (``markdown.title_line``: a plain text's "O modelo de memória", on which a part cut to
    fit ended, stop 50)."""
    if text[text.rfind("\n", 0, start) + 1:start].strip():
        return False  # the part opens mid-line
    if _HEADING.match(text, start) is not None:
        return True
    line_end = text.find("\n", end)
    line_end = len(text) if line_end == -1 else line_end
    if text[end:line_end].strip() or not title_line(text[start:end]):
        return False
    after = text.find("\n", line_end + 1)
    return not text[line_end + 1:len(text) if after == -1 else after].strip()


def best_run(text: str, question: str, room_chars: int, shown: str = "") -> tuple[int, int] | None:
    """(start, end) of the run of consecutive parts within ``room_chars`` that holds the most
    distinct question terms; on a tie the run that opens with a part holding one (the run
    starts at what was asked for, not before it), then one that opens on prose rather than a
    fenced code block (a synopsis block "npm" says less of npm than "npm is the package
    manager ..."), then the earliest (the text's opening when no part holds one). A run
    never ends on a heading (what it heads is cut off) unless the heading is all of it. A
    term ``shown`` already holds (the item's header shows its title) counts only when
    nothing else of the question does. When no part is that short (one long sentence, a code
    block), the part holding the most terms, cut at the last space within ``room_chars``;
    None when not even a word fits."""
    spans = parts(text)
    wanted = terms(question) - terms(shown) or terms(question)
    found = [terms(text[s:e]) & wanted for s, e in spans]
    heading = [_heads(text, s, e) for s, e in spans]
    # A part that opens a code block opens where the block does (``parts``), indented or not.
    code = {a for a, _ in code_fences(text)}
    prose = [s not in code for s, _ in spans]
    # (terms held, opens on one, opens on prose, start, end)
    best: tuple[int, bool, bool, int, int] | None = None
    for i, (start, _) in enumerate(spans):
        held: set[str] = set()
        end, kept = None, 0
        for j in range(i, len(spans)):
            if spans[j][1] - start > room_chars:
                break
            held |= found[j]
            if j == i or not heading[j]:
                end = spans[j][1]
                kept = len(held)
        if end is None:
            continue
        rank = (kept, bool(found[i]), prose[i])
        if best is None or rank > best[:3]:
            best = (*rank, start, end)
    if best is not None:
        return best[3], best[4]
    if not spans:
        return None
    start = spans[max(range(len(spans)), key=lambda i: (len(found[i]), -i))][0]
    cut = text.rfind(" ", start, start + room_chars + 1)
    return None if cut <= start else (start, len(text[:cut].rstrip()))


def fit(question: str, e: Evidence, budget_tokens: int, chars_per_token: float, used_tokens: int,
        render: Callable[[Evidence], str]) -> tuple[Evidence, str, int] | None:
    """(``e`` cut to fit, the rendering with it, its cost), or None when ``e`` is no source
    excerpt, the room the rest leaves (``used_tokens`` of ``budget_tokens``) is under
    ``MIN_ROOM_TOKENS``, or no part of it fits. ``render``: the whole rendering with a part
    of ``e`` in its place (recall's list, or memory_prepare's bundle), which decides."""
    if budget_tokens - used_tokens < MIN_ROOM_TOKENS:
        return None
    if (e.kind != "excerpt" or e.char_start is None or e.char_end is None
            or e.char_end - e.char_start != len(e.text)):
        return None
    # The first guess leaves room for the item's header; the rendering decides.
    room = int((budget_tokens - used_tokens) * chars_per_token) - 200
    for _ in range(8):
        if room < MIN_ROOM_TOKENS * chars_per_token / 2:
            return None
        span = best_run(e.text, question, room, e.source.title if e.source else "")
        if span is None:
            return None
        start, end = span
        cut = part_of(e, start, text=e.text[start:end], char_start=e.char_start + start,
                      char_end=e.char_start + end, clipped=True)
        rendered = render(cut)
        cost = token_cost(rendered, chars_per_token)
        if cost <= budget_tokens:
            return cut, rendered, cost
        room = end - start - int((cost - budget_tokens) * chars_per_token) - 1
    return None


def least_budget(serves: Callable[[int], bool], budget_tokens: int, whole_tokens: int) -> int:
    """The smallest budget above ``budget_tokens`` (which served nothing) that serves the first
    item, ``whole_tokens`` being one that does (the item whole): what a recall that served
    nothing tells its caller. ``serves(b)``: a budget of ``b`` serves the item, whole or cut
    (``fit``). A bisection: a few renderings, and only when nothing was served."""
    lo, hi = budget_tokens, max(whole_tokens, budget_tokens + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if serves(mid):
            hi = mid
        else:
            lo = mid
    return hi


def fit_next(question: str, evidence: Sequence[Evidence], kept: int, budget_tokens: int,
             chars_per_token: float, used_tokens: int, prefixes: Prefixes
             ) -> tuple[Evidence, str, int] | None:
    """``fit`` for the item after the ``kept`` prefix of recall's list (None past its end).
    ``prefixes``: the budget cut's renderings of ``evidence`` (the prefix is not rendered
    again)."""
    if kept >= len(evidence):
        return None
    return fit(question, evidence[kept], budget_tokens, chars_per_token, used_tokens,
               lambda cut: prefixes.then(kept, cut))
