"""Markdown structure that ingest and recall both read: fenced code blocks and headings.
Offsets index into the text given; nothing here changes it."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

# A fenced code block (CommonMark): its opening backticks or tildes after up to three
# spaces, to a closing fence of that character at least as long, or the end of the text.
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*(?:\n.*?^ {0,3}\1[`~]*[ \t]*$|.*\Z)",
                    re.MULTILINE | re.DOTALL)
# An ATX heading line ("## Text ##": "#hashtag" is none); its text is trimmed in Python
# (``heading_text``): the pattern it replaced, ``#{1,6}\s+(.+?)\s*#*\s*$``, tried every
# split of a run of spaces between its three whitespace parts (a heading "# a", 5,000
# spaces, "b" took 118 s), and its ``\s`` read the next line as the text of an empty heading.
ATX_LINE = re.compile(r"[ \t]{0,3}(#{1,6})(?:[ \t]+(.*))?")
# A setext underline: "====" (level 1) or "----" (level 2) under a paragraph.
SETEXT_UNDERLINE = re.compile(r"[ \t]{0,3}(=+|-+)[ \t]*")
# A line that opens a block of its own (a list item, a quote, a table row, indented code): no
# paragraph line a setext underline could make a heading of.
_NOT_PARAGRAPH = re.compile(r"[ \t]{4}|[ \t]{0,3}(?:[-*+>|]|\d{1,9}[.)])(?:[ \t]|$)")
# A line that opens a block of its own or stands alone: a list item, a quote, a table row, an
# ATX heading, a fence or a link reference definition. Any other line of a paragraph after
# its first is where the writer's editor wrapped a sentence (Markdown wraps paragraphs): a
# wrapped line may open with "-1" or "#42", which a marker's space tells from a list item or
# a heading. Compile it with ``re.MULTILINE`` (an empty item's marker ends its line).
BLOCK_LINE = (r"[ \t]*(?:(?:[-*+]|#{1,6}|\d{1,9}[.)])(?:[ \t]|$)|[>|]|```|~~~"
              r"|\[[^\]\n]+\]:[ \t])")
# A line break a reader reads as one: after a sentence's end or a clause-opening colon
# (closing quotes or emphasis may follow the mark), or before a block's line.
LINE_END = r"[.?!:][\"')\]*_`]{0,2}\n|\n(?=" + BLOCK_LINE + r")"
# What stands before the full stop of an ordered list's marker on its line ("   2. Leave"),
# and how far from its line's start such a full stop may stand.
_ORDERED_MARKER = re.compile(r"[ \t]*\d{1,9}")
MARKER_REACH = 32
# A line that only marks a place: an HTML anchor (``<a id="20.5.0"></a>``, as a changelog puts
# above each release's heading) or a one-line HTML comment.
MARKER_LINE = re.compile(
    r"[ \t]*(?:<a\s+(?:id|name)=[^<>]*>\s*</a>|<a\s+(?:id|name)=[^<>]*/>|<!--.*?-->)[ \t]*")
# An Obsidian wikilink, "[[Priya Raman]]", "[[Priya Raman|Priya]]" or "[[Billing#Phase 2|the
# phase]]", and an embed, "![[diagram.png]]": (the embed's "!", the page it names, its
# "#anchor" and "|alias"). Bounded parts: linear on any input.
WIKILINK = re.compile(r"(!?)\[\[([^\[\]\n|#]{1,500})((?:#[^\[\]\n|]{0,500})?(?:\|[^\[\]\n]{0,500})?)\]\]")
# Paragraph lines kept for a setext heading's text (a title is cut to a few hundred
# characters anyway).
_TITLE_LINES = 40


# A plain title line: short, a few words, not a sentence (no closing mark) and not a list
# item or a quote ("The read path", "O modelo de memória").
TITLE_LINE_CHARS = 120
TITLE_LINE_WORDS = 12
_NOT_A_TITLE_LINE = re.compile(r"[.,;:!?]$|^[-*+>#|]|^\d{1,9}[.)]\s")


def title_line(line: str) -> bool:
    """Whether ``line`` (one line, stripped or not) reads as a title a plain text writes over
    its paragraph: at most ``TITLE_LINE_CHARS`` characters and ``TITLE_LINE_WORDS`` words,
    not ending in a sentence's or clause's mark, no list item, quote, table row or heading
    marker. Whether a blank line follows it is the caller's to say."""
    line = line.strip()
    return (bool(line) and len(line) <= TITLE_LINE_CHARS and len(line.split()) <= TITLE_LINE_WORDS
            and _NOT_A_TITLE_LINE.search(line) is None)


def ordered_marker(text: str, stop: int) -> bool:
    """Whether the full stop at ``stop`` is an ordered list item's marker ("  2. "), which ends
    no sentence. Read no further back than ``MARKER_REACH`` characters, so a long line of
    sentences is read in linear time."""
    if text[stop] != ".":
        return False
    line = text.rfind("\n", max(stop - MARKER_REACH, 0), stop) + 1
    return ((line > 0 or stop <= MARKER_REACH)
            and _ORDERED_MARKER.fullmatch(text, line, stop) is not None)


def code_fences(text: str) -> list[tuple[int, int]]:
    """(start, end) of each fenced code block of ``text``, from its opening backticks or
    tildes (after up to three spaces) to its closing fence or the end of the text."""
    return [(m.start() + len(m.group()) - len(m.group().lstrip()), m.end())
            for m in _FENCE.finditer(text)]


def enclosing(position: int, spans: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The one of ``spans`` (sorted, not overlapping) that ``position`` lies strictly inside
    (a cut there would split it), or None."""
    i = bisect.bisect_right(spans, (position, position)) - 1  # the last one starting before
    return spans[i] if i >= 0 and spans[i][0] < position < spans[i][1] else None


def heading_text(raw: str) -> str:
    """A heading line's text without its closing sequence of ``#`` (CommonMark: one preceded
    by a space or tab, or the whole text)."""
    text = raw.strip(" \t")
    bare = text.rstrip("#")
    if bare != text and (not bare or bare[-1] in " \t"):
        text = bare.rstrip(" \t")
    return text


def headings(text: str, fences: list[tuple[int, int]] | None = None
             ) -> Iterator[tuple[int, int, str]]:
    """(offset of its first line, level, text as written) of each heading of ``text``, in
    order: ATX headings and setext ones (a paragraph over a line of "=" is level 1, over "-"
    level 2: "PyYAML" over "======" is the README's title). Lines that touch one of
    ``fences`` (``code_fences(text)``; none given: the caller masked them) are code."""
    spans = fences or []
    paragraph: list[str] = []
    opened = 0
    end = 0
    for raw in text.splitlines(keepends=True):
        at, end = end, end + len(raw)
        line = raw.splitlines()[0]  # without its line break, whichever it is
        i = bisect.bisect_left(spans, (end, end)) - 1  # the last fence opening on or before it
        if (i >= 0 and spans[i][1] > at) or not line.strip():
            paragraph = []
            continue
        atx = ATX_LINE.fullmatch(line)
        if atx:
            paragraph = []
            yield at, len(atx.group(1)), heading_text(atx.group(2) or "")
            continue
        underline = SETEXT_UNDERLINE.fullmatch(line)
        if underline:
            if paragraph:
                yield (opened, 1 if underline.group(1)[0] == "=" else 2,
                       " ".join(p.strip() for p in paragraph))
            paragraph = []  # with no paragraph above, a thematic break (or a line of "=")
            continue
        if _NOT_PARAGRAPH.match(line):
            paragraph = []
        elif len(paragraph) < _TITLE_LINES:
            if not paragraph:
                opened = at
            paragraph.append(line)
        else:
            paragraph[-1] = line  # still a paragraph: an underline below it makes a heading


def section_starts(text: str, fences: list[tuple[int, int]] | None = None) -> list[int]:
    """Offsets (increasing) where ``text``'s sections start: each heading's first line
    outside fenced code blocks (``fences``: ``code_fences(text)``, computed when not given)."""
    fences = code_fences(text) if fences is None else fences
    return [at for at, _, _ in headings(text, fences)]


# A section trail's heading keeps this many characters (a trail holds at most six: one a level).
TRAIL_HEADING_CHARS = 200


def trail_heading(words: str) -> str:
    """A heading as a section trail keeps it: whitespace runs one space, control characters
    out, at most ``TRAIL_HEADING_CHARS`` characters."""
    return " ".join("".join(ch for ch in words if ch.isprintable() or ch.isspace()).split())[
        :TRAIL_HEADING_CHARS]


def section_trails(text: str, offsets: list[int], title: str = "",
                   fences: list[tuple[int, int]] | None = None) -> list[list[tuple[int, str]]]:
    """For each of ``offsets`` (increasing), the headings whose sections it lies in, outermost
    first, as (level, text): every heading that starts before it and is not closed by a
    heading of its level or above before it. A heading at the offset itself is the
    section's own (it is in the text that starts there), not its trail, and so is one that
    only blank and marker lines stand before (a changelog's ``<a id="20.5.0"></a>``). A
    leading heading that says the document's ``title`` is left out (the title is said
    already)."""
    fences = code_fences(text) if fences is None else fences
    found = list(headings(text, fences))
    trails: list[list[tuple[int, str]]] = []
    stack: list[tuple[int, str]] = []
    i = 0
    for offset in offsets:
        offset = _past_markers(text, offset)
        while i < len(found) and found[i][0] < offset:
            _opened(stack, found[i][1], found[i][2])
            i += 1
        trail = [h for h in stack if h[1]]
        if i < len(found) and found[i][0] == offset:  # its own heading closes what it closes
            trail = [h for h in trail if h[0] < found[i][1]]
        if trail and title and trail[0][1].casefold() == " ".join(title.split()).casefold():
            trail = trail[1:]
        trails.append(trail)
    return trails


def extend_trail(trail: list[tuple[int, str]], text: str) -> list[tuple[int, str]]:
    """``trail`` (where ``text`` starts in its document) carried to the end of ``text``: the
    sections of the headings in ``text`` opened, those they close closed."""
    out = list(trail)
    for _, level, words in headings(text, code_fences(text)):
        _opened(out, level, words)
    return [h for h in out if h[1]]


def _opened(trail: list[tuple[int, str]], level: int, words: str) -> None:
    """``trail`` after a heading of ``level``: the sections it closes closed, its own opened."""
    while trail and trail[-1][0] >= level:
        trail.pop()
    trail.append((level, trail_heading(words)))


def _past_markers(text: str, offset: int) -> int:
    """``offset`` moved past the blank and marker lines (``MARKER_LINE``) that start there."""
    while offset < len(text):
        end = text.find("\n", offset)
        end = len(text) if end == -1 else end + 1
        line = text[offset:end].rstrip("\r\n")
        if line.strip() and not MARKER_LINE.fullmatch(line):
            break
        offset = end
    return offset
