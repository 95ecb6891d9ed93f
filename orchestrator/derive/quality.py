"""Quality gates for derived memory: code, URLs, markup, numbers and log lines are not knowledge.

Order of work, where each gate sits:

1. ``mask_markup`` (extraction, before parsing): fenced and indented code blocks,
   inline code and HTML ``code``/``pre`` elements, HTML comments (``<!-- ... -->``, over
   any number of lines), URLs and e-mail addresses (an autolink's brackets too), backslash
   escapes, Markdown images and badges, link targets, MyST roles and target lines (``{ref}`...```,
   ``(label)=``), HTML tags, table rows, heading/emphasis/list markers and log lines
   are overwritten with spaces of the same length. The parser then never sees
   them, while every character offset of the remaining prose stays where it was
   (entity spans are offsets into the chunk). Extraction masks a chunk's whole
   document and cuts the chunk's span out of it (``extract.masked_texts``): a chunk
   that starts inside a fenced block cannot tell code from prose on its own;
2. ``plausible_entity`` (extraction): a mention becomes an entity only when its
   name reads as a name: letters first, no URL, path, code punctuation or
   identifier shape (``snake_case``, ``camelCase``, ``a.b``), not mostly digits,
   at most six words; not a shorthand of chat and review ("LGTM", "AFAIK", "WIP"), a
   date format's placeholder ("YYYY-MM-DD") nor a reference to a part of a document
   ("Listing 4-3", "Chapter 10", "Figure 2.1", "Appendix B");
3. ``plausible_statement`` (consolidation and profiles): a claim's sentence
   enters an observation or a profile only when it is prose: enough letters,
   enough words, no code punctuation (a semicolon only where it ends a statement of code:
   at a line's end or with no space after it; prose joins clauses with one), no URL, not
   a log line, not number soup (the digits of a date or a time of day do not count). A
   claim keeps its sentence as written (inline code, links and emphasis included: the
   reader sees "run `make test` first", not "run first"), so the test masks it as
   extraction did (``statement_junk``).

``junk_reason`` says why a derived text would be junk by the same tests; the
derive benchmark (``benchmarks/derive_junk.py``) counts with it (and with
``statement_junk`` for texts made of claims' sentences), before and after the
gates, over a folder of ordinary Markdown.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from orchestrator.inputs import CONTROL_CHARACTERS
from orchestrator.markdown import WIKILINK, code_fences

_S = TypeVar("_S")

# Fenced blocks (``` or ~~~, to the closing fence or the end of the text).
_FENCE = re.compile(r"(^|\n)[ \t]*(```|~~~)[^\n]*\n.*?(\n[ \t]*\2[^\n]*(?=\n|$)|$)", re.S)
# Indented code: lines of 4+ spaces or a tab after a blank line, with the lines that follow.
_INDENTED = re.compile(r"(?:(?<=\n\n)|^)((?:(?: {4}|\t)[^\n]*(?:\n|$))+)")
# A code span may wrap over a line break, as in CommonMark, but never over a blank line.
_INLINE_CODE = re.compile(r"`(?:[^`\n]|\n(?![ \t]*\n))*`")
# MyST (Sphinx's Markdown): a role before a code span ({ref}`pip download`) and a target
# line ("(repeatability)=" above a heading).
_MYST = re.compile(r"\{[a-z][\w.:-]*\}(?=`)|^[ \t]*\([\w.:-]+\)=[ \t]*$", re.M)
# The bounds keep every pattern linear: unbounded, a line of 400 kB of "](" or "![" took
# 90-100 s (each opener scanned the rest of the line for its closer). A link text or target
# past them is left as text.
_IMAGE = re.compile(r"!\[[^\]\n]{0,500}\]\([^)\n]{0,2000}\)")
_LINK_TARGET = re.compile(r"(?<=\])\([^)\n]{0,2000}\)|(?<=\])\[[^\]\n]{0,500}\]")
_REF_DEF = re.compile(r"^[ \t]*\[[^\]\n]+\]:[^\n]*$", re.M)
# An address's local part is at most 64 characters (RFC 5321): unbounded, every word
# boundary of a long run like "1.1.1.1..." scanned the rest of the run for an "@". A URL
# ends before a space or an angle bracket: an autolink "<https://...>" is masked whole (the
# URL here, then its brackets as a tag), not with its "<" left in a claim's sentence.
_URL = re.compile(r"\b(?:https?|ftp|file)://[^\s<>]+|\bwww\.[^\s<>]+"
                  r"|\b[\w.+-]{1,64}@[\w-]+\.[\w.-]+")
_HTML = re.compile(r"<[^>\n]{1,200}>")
# A template's expressions and tags (Jinja, Liquid, Handlebars, Hugo): "{{ license |
# default("[More Information Needed]", true) }}" is code, not the prose of a model card.
# A setext heading's underline and a thematic break: a line of "=", "-", "*" or "_" only
# (left as text, a heading's claim read "Microsoft =========").
_RULE_LINE = re.compile(r"^[ \t]*(?:={2,}|-{3,}|\*{3,}|_{3,})[ \t]*$", re.M)
# No brace inside: a run of openers ("{{{{...") fails at once instead of scanning ahead.
_TEMPLATE = re.compile(r"\{\{[^\n{]{0,1000}?\}\}|\{%[^\n{]{0,1000}?%\}")
# What HTML marks as code or preformatted, with its content.
_HTML_CODE_OPEN = re.compile(r"<(code|pre|kbd|samp)\b[^>\n]{0,200}>", re.I)
_HTML_CODE_CLOSE = {tag: re.compile(rf"</{tag}\s*>", re.I) for tag in ("code", "pre", "kbd", "samp")}
_TABLE = re.compile(r"^[ \t]*\|[^\n]*$|^[^\n|]*\|[ \t]*:?-{3,}[^\n]*$", re.M)
_LOG = re.compile(r"^[^\n]*(?:\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|\b\d{2}:\d{2}:\d{2}\b"
                  r"|\[(?:INFO|WARN|WARNING|ERROR|DEBUG|TRACE|FATAL)\]"
                  r"|^[ \t]*(?:INFO|WARN|WARNING|ERROR|DEBUG|TRACE|FATAL)\b[:\s])[^\n]*$", re.M)
_SHELL = re.compile(r"^[ \t]*(?:\$|>|#!|C:\\)[ \t]+[^\n]*$", re.M)
# A row of a plain-text table: fields set apart by a run of three spaces ("U+0110
# Dcroat               1.3 (Sans, Sans Bold, ...)", a glyph coverage table in
# /usr/share/doc whose rows read as sentences of font names: 146,884 pairs and relations
# such as "Sans condenses Serif"). Prose separates its words by one space (two after a full
# stop, in older text; a tab may sit in a pasted log line).
_COLUMNS = re.compile(r"^[^\n]*\S {3,}\S[^\n]*$", re.M)
_CONTROL = re.compile(CONTROL_CHARACTERS)
# A backslash escape: the backslash before ASCII punctuation ("\[", "\*", "\_") is markup
# (a changelog's "\[[`18862e4d5d`](...)]" read "\ `18862e4d5d`" in its claims).
_ESCAPE = re.compile(r"\\(?=[!-/:-@\[-`{-~])")
# Line markers (a task's checkbox "- [x]" with its item's) and emphasis. An underscore
# between two letters or digits is none (CommonMark: "hello_cargo" reads as written; blanked,
# the Rust book's "target/debug/hello_cargo" read "hello cargo" in a claim).
_MARKERS = re.compile(r"^[ \t]*(?:#{1,6}|[-*+]|\d+[.)]|>)[ \t]+(?:\[[ xX]\][ \t]+)?"
                      r"|[*~]{1,3}(?=\S)|(?<=\S)[*~]{1,3}"
                      r"|(?<![^\W_])_{1,3}(?=\S)|(?<=\S)_{1,3}(?![^\W_])", re.M)

_CODE_CHARS = set("{}[]()<>=;`$|\\^~#@*")
# snake_case, camelCase, a call (x.y(), a dotted name (os.path).
_IDENTIFIER = re.compile(r"\b[a-z]+_[a-z0-9_]+\b|\b[a-z]+[A-Z][A-Za-z0-9]*\b|\b\w+\.\w+\("
                         r"|\b[a-z]\w*\.[a-z]\w*\b")
_VERSION = re.compile(r"\bv?\d+\.\d+(?:\.\d+)*\b")
_PATHISH = re.compile(r"[/\\]|\.(?:py|md|json|ya?ml|toml|sh|txt|cfg|ini|lock|exe|dll)\b", re.I)


def _spaces(text: str) -> str:
    """Spaces of the same length (newlines kept), so offsets do not move."""
    return "".join("\n" if ch == "\n" else " " for ch in text)


def _blank(match: re.Match[str]) -> str:
    return _spaces(match.group(0))


def mask_fences(text: str) -> str:
    """``text`` with fenced code blocks overwritten by spaces (same length): a "# comment" in
    a shell block is not a heading."""
    return _FENCE.sub(_blank, text)


def _mask_html_code(text: str) -> str:
    """``text`` with each ``<code>``/``<pre>``/``<kbd>``/``<samp>`` element, tags and content,
    overwritten by spaces (newlines kept). In one pass: each opener's closer is searched from
    there on, and a tag with no closer left stops being searched (a regex with a lazy
    ``.*?`` scanned to the end of the text from every unclosed opener: 96 s for 400 kB)."""
    parts: list[str] = []
    at = 0
    unclosed: set[str] = set()
    for opener in _HTML_CODE_OPEN.finditer(text):
        tag = opener.group(1).lower()
        if opener.start() < at or tag in unclosed:
            continue
        closer = _HTML_CODE_CLOSE[tag].search(text, opener.end())
        if closer is None:
            unclosed.add(tag)
            continue
        parts += [text[at:opener.start()], _spaces(text[opener.start():closer.end()])]
        at = closer.end()
    return "".join(parts) + text[at:] if parts else text


def mask_html_comments(text: str) -> str:
    """``text`` with each HTML comment (``<!-- ... -->``, over any number of lines) overwritten
    by spaces, newlines kept: a reader never sees it (API docs keep their change history
    there, "<!-- YAML changes: - version: v6.8.0 pr-url: ..."). One pass with ``str.find``;
    an opener with no closer after it is left as it is (nothing after it is hidden)."""
    parts: list[str] = []
    at = 0
    while (start := text.find("<!--", at)) >= 0:
        end = text.find("-->", start + 4)
        if end < 0:
            break
        parts += [text[at:start], _spaces(text[start:end + 3])]
        at = end + 3
    return "".join(parts) + text[at:] if parts else text


def _word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def escaped_identifiers(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Spans of words joined by escaped underscores: Markdown writes an identifier outside a
    code span as "CHECK\\_NOT\\_NULL" or "async\\_hooks" (Node's changelogs: 642 of them), and
    with only its backslashes blanked the parser read "CHECK _NOT _NULL" and took "NULL",
    "ERR" and "NGHTTP2" for organisations. Such a word is code, whole. One pass: each
    ``\\_`` is widened over the word characters and escaped underscores beside it."""
    end = len(text) if end is None else end
    spans: list[tuple[int, int]] = []
    at = start
    while (i := text.find("\\_", at, end)) >= 0:
        left = i
        while left > start:
            if left >= start + 2 and text[left - 2:left] == "\\_":
                left -= 2
            elif _word_char(text[left - 1]):
                left -= 1
            else:
                break
        right = i + 2
        while right < end:
            if text.startswith("\\_", right) and right + 2 <= end:
                right += 2
            elif _word_char(text[right]):
                right += 1
            else:
                break
        if any(ch.isalnum() for ch in text[left:right]):
            spans.append((left, right))
        at = right
    return spans


def _mask_escaped_identifiers(text: str) -> str:
    spans = escaped_identifiers(text)
    if not spans:
        return text
    parts: list[str] = []
    at = 0
    for a, b in spans:
        parts += [text[at:a], " " * (b - a)]
        at = b
    return "".join(parts) + text[at:]


def _wikilink_target(match: re.Match[str]) -> str:
    """A wikilink as the page it names: "[[Priya Raman|Priya]]" reads "Priya Raman" (the
    parser took "Priya Raman|Priya" for no name at all, and a claim's sentence showed the
    bar), a heading anchor and an alias are masked; an embed is masked whole."""
    if match.group(1):
        return _spaces(match.group(0))
    return "  " + match.group(2) + _spaces(match.group(3)) + "  "


def _wikilink_shown(match: re.Match[str]) -> str:
    """A wikilink as Obsidian shows it: its alias, else the page it names; an embed, nothing."""
    if match.group(1):
        return " "
    alias = match.group(3).partition("|")[2]
    return alias if alias.strip() else match.group(2)


# A link to a heading ("[Example 1 - Basic GET request](#example-1---basic-get-request)",
# "[Client](Client.md#class-client)"): group 1 is its text.
_SECTION_LINK = re.compile(r"(?<!!)\[([^\]\n]{1,500})\]\([^)\s]*#[^)\s]*\)")


def vocabulary_text(body: str, masked: str) -> str:
    """``masked`` (``mask_markup(body)``) without the text of links to headings: such a text
    repeats a heading's words capitalised as the heading writes them ("As demonstrated in
    [Example 1 - Basic GET stream request](#...)"), which is no evidence that a word is a name
    (``nlp._vocabulary`` reads a word capitalised inside a sentence as one). Same length."""
    pieces, at = [], 0
    for m in _SECTION_LINK.finditer(body):
        start, end = m.span(1)
        pieces += [masked[at:start], " " * (end - start)]
        at = end
    return "".join(pieces) + masked[at:] if pieces else masked


def reader_text(text: str) -> str:
    """``text`` without what a rendered page never shows (same length, spaces, newlines
    kept): HTML comments and link reference definitions ("[`fs.stat()`]: #fsstatpath")."""
    return _REF_DEF.sub(_blank, mask_html_comments(text))


# An ATX heading's line; a list item's or a quote's opening marker (with a task box); where
# a list item or a quote opens a line (it starts a sentence of its own).
_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}(?:[ \t][^\n]*)?$", re.M)
_OPENING_MARKER = re.compile(r"^[ \t]*(?:(?:[-*+]|\d{1,9}[.)])[ \t]+(?:\[[ xX]\][ \t]+)?|>[ \t]*)+",
                             re.M)
_ITEM_LINE = re.compile(r"\n(?=[ \t]*(?:(?:[-*+]|\d{1,9}[.)])[ \t]|>))")


def prose_sentences(text: str) -> list[tuple[str, str]]:
    """The sentences of a passage of Markdown as written and as a reader sees them:
    ``(written, shown)`` pairs. A heading is no sentence (it labels a section, it states
    nothing: "#### Example - Client connect event" was a summary's sentence); each list
    item starts one of its own; ``shown`` is ``inline_text`` of it, without its list or
    quote marker (no emphasis markers, a link's text without its target; code spans as
    written). A fenced code block is one unit. Judge a sentence on ``written`` (a code block
    is recognised by its fences), serve ``shown``."""
    from orchestrator.derive.summarize import split_sentences

    for pattern, by in ((_HEADING, ""), (_ITEM_LINE, "\n\n"), (_OPENING_MARKER, "")):
        fences = code_fences(text)  # a code block's lines stay as written
        text = pattern.sub(lambda m, f=fences, b=by: m.group() if any(  # type: ignore[misc]
            a <= m.start() < e for a, e in f) else b, text)
    # A fenced code block is one unit, never cut at its blank lines or full stops: a piece of
    # it without its fences read as prose (a mermaid diagram's "pending --> idle : timeout"
    # became a summary's sentence).
    units: list[str] = []
    at = 0
    for start, end in code_fences(text):
        units += split_sentences(text[at:start])
        units.append(text[start:end].strip())
        at = end
    units += split_sentences(text[at:])
    out = []
    for written in units:
        shown = inline_text(written, code=True)
        if shown:
            out.append((written, shown))
    return out


# A word shaped like code: a capital after its first letter ("EventEmitter", "readFile",
# "HMAC") or an underscore.
_CODE_SHAPED = re.compile(r"\b(?:[A-Za-z][a-z0-9]*[A-Z]\w*|[A-Za-z]\w*_\w*)\b")
_CALLED = re.compile(r"\b([A-Za-z]\w*)\(")


def code_names(text: str) -> frozenset[str]:
    """The code-shaped words (``_CODE_SHAPED``) ``text`` writes as code: in a code span or a
    fenced block, or called ("BooleanValue()"). A changelog's prose names the same classes
    and functions bare ("replace WeakSet global by the ..."), and the small model took each
    for an organisation; the document that writes "`WeakSet`" elsewhere says what it is. Only
    code-shaped words: "Alice" in a code example's string stays a name."""
    code = " ".join([*(m.group(0) for m in _INLINE_CODE.finditer(text)),
                     *(text[a:b] for a, b in code_fences(text))])
    found = set(_CODE_SHAPED.findall(code))
    found.update(w for w in _CALLED.findall(text) if _CODE_SHAPED.fullmatch(w))
    return frozenset(found)


_TWO_LETTERS = re.compile(r"[^\W\d_]{2}")


def blank_without_words(text: str) -> str:
    """``text``, or spaces of its length when it holds no run of two letters: such a chunk
    (masked punctuation, digits, table rows) can yield no name and no sentence of three
    words, and the parser spent ~70 ms on each of its 1,200 punctuation tokens."""
    return text if _TWO_LETTERS.search(text) else " " * len(text)


# Function words by language, written lower case, none of them an English word a technical
# text writes lower case ("per", "come", "is", "an", "on", "will" and "was" are left out of
# the others; "a", "in" and "as" out of every list). The entity model and the sentence rules
# read English: a Portuguese page read by them made "Conflitos de", "Detectadas" and "Três"
# entities (stop 50).
_FUNCTION_WORDS = {
    "en": "the of and to is that for with are this be by from which were has have not or its "
          "when can into there their than each these those would should been",
    "pt": "de que não para com uma os das dos em é são pelo pela ao à mais como também ou "
          "sobre isso este esta você seu sua já",
    "es": "de que el la los las del para con una por es son al lo como más pero sus este esta "
          "también ya muy",
    "fr": "le la les des du de et est une pour dans que qui sur pas au aux avec ce cette sont "
          "par ne plus",
    "de": "der die das und ist nicht mit den dem des ein eine zu von auf für sich auch als "
          "wird werden oder",
    "it": "il lo la gli le di che è con una del della dei sono non più anche questo nel",
    "nl": "de het een en van dat niet met voor op zijn aan ook als bij worden wordt",
}
_LANGUAGE_OF = {word: frozenset(k for k, words in _FUNCTION_WORDS.items() if word in words.split())
                for words in _FUNCTION_WORDS.values() for word in words.split()}
LANGUAGE_NAMES = {"en": "English", "pt": "Portuguese", "es": "Spanish", "fr": "French",
                  "de": "German", "it": "Italian", "nl": "Dutch"}
_LOWER_WORD = re.compile(r"(?<![\w'-])[^\W\d_A-Z][^\W\d_]*(?![\w'-])")
# Function words a text must hold before its language is told (a list of names, a code
# block's leftovers or a heading tells nothing), and how many times English's count
# another language's must reach.
LANGUAGE_EVIDENCE = 8
LANGUAGE_MARGIN = 2.0


def written_language(text: str) -> str | None:
    """The language ``text`` (prose, markup masked) is written in by its function words: a
    key of ``LANGUAGE_NAMES``, or None where it holds too few to tell (fewer than
    ``LANGUAGE_EVIDENCE``). Another language wins only with ``LANGUAGE_MARGIN`` times
    English's count, so an English page quoting a phrase of another stays English. Only
    words written lower case count ("MIT", "Die Hard" and "De Niro" are names)."""
    counts = dict.fromkeys(_FUNCTION_WORDS, 0)
    for match in _LOWER_WORD.finditer(text):
        word = match.group(0)
        if word.islower():
            for language in _LANGUAGE_OF.get(word, ()):
                counts[language] += 1
    english = counts.pop("en")
    other, most = max(counts.items(), key=lambda kv: kv[1])
    if most >= LANGUAGE_EVIDENCE and most >= LANGUAGE_MARGIN * english:
        return other
    return "en" if english >= LANGUAGE_EVIDENCE else None


def mask_markup(text: str) -> str:
    """``text`` with code, URLs, markup, log lines and plain-text table rows overwritten by
    spaces (same length)."""
    out = _INDENTED.sub(_blank, mask_fences(text))
    out = _mask_escaped_identifiers(_mask_html_code(mask_html_comments(out)))
    out = WIKILINK.sub(_wikilink_target, out)
    for pattern in (_MYST, _TEMPLATE, _INLINE_CODE, _ESCAPE, _IMAGE, _LINK_TARGET, _REF_DEF,
                    _URL, _HTML, _TABLE, _LOG, _SHELL, _RULE_LINE):
        out = pattern.sub(_blank, out)
    # Table rows as written: the masks above leave runs of blanks inside prose lines. Joined
    # once (a copy of the text per row took 2.5 s over a 1.5 MB table, 56 s over five).
    parts, last = [], 0
    for row in _COLUMNS.finditer(text):
        parts += [out[last:row.start()], _spaces(row.group(0))]
        last = row.end()
    out = "".join(parts) + out[last:] if parts else out
    out = _MARKERS.sub(_blank, out)
    # Control characters (an escape sequence of a pasted log, a form feed) are no prose: a
    # sentence read past them would become a claim of invisible characters.
    out = _CONTROL.sub(" ", out)
    # Link text stays ("see [the guide](...)" reads "see the guide"), its brackets go.
    return out.replace("[", " ").replace("]", " ")


_EMPHASIS = re.compile(r"(?<![\w*_~])[*_~]{1,3}(?=\S)|(?<=\S)[*_~]{1,3}(?![\w*_~])")


_KEPT_CODE = re.compile("\x00([0-9]+)\x00")


def inline_text(line: str, *, code: bool = False) -> str:
    """One line of Markdown as a reader sees it: images (badges), embeds and HTML tags gone, a
    link's text without its target, a wikilink as it is shown ("[[Priya Raman|Priya]]" reads
    "Priya"), a code span's content without its backticks, no emphasis
    markers, whitespace runs as one space ("rustfmt [![linux](...)](...)" reads "rustfmt").
    ``code``: code spans stay as written, backticks and all (a summary's sentence: "the
    `Dispatcher.dispatch` function" says it is code; a title shows its words)."""
    spans: list[str] = []

    def kept(match: re.Match[str]) -> str:
        spans.append(match.group())
        return f"\x00{len(spans) - 1}\x00"

    if code:  # each span a placeholder the other patterns leave alone, put back at the end
        line = _INLINE_CODE.sub(kept, line)
    out = WIKILINK.sub(_wikilink_shown, _IMAGE.sub(" ", line))
    out = _LINK_TARGET.sub("", out)
    out = _HTML.sub(" ", out).replace("[", "").replace("]", "")
    if not code:
        out = re.sub(r"`+([^`]*)`+", r"\1", out)
    out = " ".join(_EMPHASIS.sub("", out).split())
    return _KEPT_CODE.sub(lambda m: spans[int(m.group(1))], out) if spans else out


# Shorthand of chat and code review, written in capitals like an acronym but naming nothing.
_SHORTHAND = frozenset({"AFAIK", "AFAICT", "AFAICS", "IIRC", "IMO", "IMHO", "LGTM", "WIP",
                        "FYI", "TBD", "TODO", "FIXME", "XXX", "PTAL", "ASAP", "RSVP", "TIA",
                        "WFH", "EOD", "OOO", "NB", "TLDR", "BTW", "ICYMI", "YMMV"})
# A date or time format's placeholder: "YYYY", "YYYY-MM-DD", "HH:MM".
_DATE_FORMAT = re.compile(r"(?:Y{2,4}|M{1,2}|D{1,2}|H{1,2}|S{1,2})"
                          r"(?:[-/.: ](?:Y{2,4}|M{1,2}|D{1,2}|H{1,2}|S{1,2}))*")

# A reference to a part of a document: its kind and its number or letter ("Listing 4-3",
# "Chapter 10", "Fig. 2.1", "Appendix B", "Table IV"); a book's listings and chapters were
# 60 events, 12 laws and a dozen products and places of the Rust book. "Section" only with a
# dotted number: "Section 230" is a law's name.
_PART_REFERENCE = re.compile(
    r"(?:Listing|Chapter|Figure|Fig\.?|Table|Appendix|Example|Exercise|Part|Step|Page|Equation"
    r"|Eq\.?|Lemma|Theorem|Definition|Algorithm|Footnote|Volume|Vol\.?|Slide|Annex|Exhibit)"
    r"\s+(?:\d+|[IVXLC]+|[A-Z])(?:[-.:]\d+)*[a-z]?|Section\s+\d+(?:[-.]\d+)+[a-z]?",
    re.IGNORECASE)


def plausible_entity(name: str) -> bool:
    """Whether a mention's text reads as the name of something (see the module docstring)."""
    name = name.strip()
    if not 2 <= len(name) <= 60 or "\n" in name or not name[0].isalnum():
        return False
    letters = sum(ch.isalpha() for ch in name)
    digits = sum(ch.isdigit() for ch in name)
    if letters < 2 or digits > letters or digits / len(name) > 0.3:
        return False
    if any(ch in _CODE_CHARS for ch in name) or ":" in name or _URL.search(name):
        return False
    if _IDENTIFIER.search(name) or _PATHISH.search(name) or _VERSION.search(name):
        return False
    if name in _SHORTHAND or _DATE_FORMAT.fullmatch(name) or _ABBREVIATION.fullmatch(name) \
            or _PART_REFERENCE.fullmatch(name):
        return False
    return len(name.split()) <= 6


# Lower-case letters with full stops abbreviate a phrase ("e. g.", "i. e.", "a.k.a."): the
# small model took "e. g." for a person (undici's docs, stop 44). Initials in capitals
# ("J. R. R.") open names and stay.
_ABBREVIATION = re.compile(r"(?:[a-z]\.\s?)+")


# A semicolon that ends a statement of code ("x = foo(bar);", "a;b"), not one between two
# clauses of prose ("Priya covers payments; Marco joins the rotation."): at the end of the
# text or a line, or with no space after it.
_CODE_SEMICOLON = re.compile(r";[ \t]*(?:$|\n)|;[^\s]", re.M)
# ISO days and times of day: 2026-12-15, 09:00, 17:30:05.
_DAY_OR_TIME = re.compile(r"(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)|(?<!\d)\d{1,2}:\d{2}(?::\d{2})?(?!\d)")


# A word that is fields: two colons or two slashes in it ("root:x:0:0:root:/root:/bin/bash",
# "/usr/sbin/nologin"), once calendar days and times of day are out of the text.
_FIELDS = re.compile(r"^(?:[^:]*:){2}|^(?:[^/]*/){2}")


def records(text: str) -> bool:
    """Whether most of ``text``'s words are colon- or slash-separated fields: a passwd or
    crontab file, a PATH, read as one "sentence" (it has no sentence marks); a path in a
    sentence ("logs go to /var/log/engram.") is prose."""
    words = _DAY_OR_TIME.sub("", text).split()
    return 2 * sum(1 for w in words if _FIELDS.match(w)) > len(words) > 0


def junk_reason(text: str) -> str | None:
    """Why ``text`` is not prose knowledge (code, URL, markup, numbers, log line, records), or
    None."""
    t = text.strip()
    if not t:
        return "empty"
    if _URL.search(t):
        return "url"
    if "```" in t or _INLINE_CODE.search(t) or any(s in t for s in ("{", "}", "=>", "::", "</")) \
            or _CODE_SEMICOLON.search(t):
        return "code"
    if _LOG.search(t):
        return "log line"
    if re.search(r"!\[|\]\(|^\s*#{1,6}\s|^\s*\||\|\s*-{3,}", t, re.M):
        return "markup"
    if _IDENTIFIER.search(t):
        return "code"
    if records(t):
        return "records"
    letters = sum(ch.isalpha() for ch in t)
    # A calendar date or a time of day is knowledge, not number soup: "Go/no-go with Tomás
    # on 2026-12-15." (its digits outnumbered a quarter of its letters).
    rest = _DAY_OR_TIME.sub("", t)
    digits = sum(ch.isdigit() for ch in rest)
    if letters < 3 or letters < 0.5 * len(rest.replace(" ", "")) or digits > 0.25 * letters:
        return "numbers"
    return None


def sentence_as_written(original: str, masked: str, start: int, end: int) -> str:
    """The sentence at ``masked[start:end]`` (``masked`` is ``original`` after ``mask_markup``,
    same length) with its inline code put back: "trained by `train_ranker.py` on LoCoMo
    dev", not "trained by  on LoCoMo dev". The span first widens over the blanks beside it on
    its line (a sentence may open with code, and one that does not end in ".", "!" or "?"
    may close with it); code spans on a line that masking blanked whole (a fenced block, a
    table row, a log line) and every other mask (URLs, markup, blocks) stay blank; so does a
    code span on a line after the sentence's last word."""
    if len(original) != len(masked):
        return masked[start:end]
    # The parser's sentence may run on over the blanks of the next lines (a changelog's next
    # item, its markup blanked): it ends where its prose does, so no code of those lines joins it.
    span = masked[start:end]
    start, end = start + len(span) - len(span.lstrip()), start + len(span.rstrip())
    while start > 0 and masked[start - 1] == " ":
        start -= 1
    if not masked[start:end].rstrip().endswith((".", "!", "?")):
        while end < len(masked) and masked[end] == " ":
            end += 1
    out: list[str] = []
    last = start
    # Code spans and identifiers written with escaped underscores, in order (an identifier's
    # escapes marked by a NUL, which no stored text holds, to drop once the sentence is closed
    # up: "CHECK_NOT_NULL" as it renders; a code span's backslashes are its own).
    written = sorted([(*m.span(), False) for m in _INLINE_CODE.finditer(original, start, end)]
                     + [(a, b, True) for a, b in escaped_identifiers(original, start, end)])
    for a, b, identifier in written:
        if a < last:
            continue  # inside the one before it
        line_start = masked.rfind("\n", 0, a) + 1
        line_end = masked.find("\n", b)
        line_end = len(masked) if line_end < 0 else line_end
        if masked[a:b].strip() or not (masked[line_start:a] + masked[b:line_end]).strip():
            continue  # not masked as inline code, or on a line that is no prose at all
        out += [masked[last:a],
                original[a:b].replace("\\_", "\0_") if identifier else original[a:b]]
        last = b
    out.append(masked[last:end])
    return _close_up("".join(out), original[start:end]).replace("\0", "")


# Punctuation that closes up to the word before it.
_CLOSING = frozenset(":;,.!?)")


def _close_up(text: str, original: str) -> str:
    """``text`` (``original`` with its markup blanked, same length) without a run of spaces
    that holds blanked markup and sits between a word and its punctuation: "**fs**: add"
    reads "fs: add", not "fs : add"; "the [guide](x)." reads "the guide."; "[[Billing#Phase
    2|the phase]]." reads "Billing." (the run holds the anchor's own spaces). Other runs stay
    (they part words); so does a space the author wrote before punctuation. One pass: each
    run of spaces is read once."""
    out: list[str] = []
    n, at = len(text), 0
    while at < n:
        if text[at] != " ":
            out.append(text[at])
            at += 1
            continue
        stop = at
        blanked = False
        while stop < n and text[stop] == " ":
            blanked = blanked or original[stop] != " "
            stop += 1
        if not (blanked and at and stop < n and text[stop] in _CLOSING):
            out.append(text[at:stop])
        at = stop
    return "".join(out)


def statement_junk(text: str) -> str | None:
    """``junk_reason`` of a claim's sentence as extraction read it: its inline code, links and
    markup masked (the claim keeps them for its reader: "run `make test` first" is prose)."""
    return junk_reason(mask_markup(text))


# A Markdown link's text (its target is masked with the rest of the markup).
_LINK_TEXT = re.compile(r"(?<!!)\[([^\]\n]{0,500})\](?=\()")


def link_list(text: str, masked: str | None = None) -> bool:
    """Whether most of ``text``'s letters are the text of Markdown links: a "See also" list
    ("* [npm access](/commands/npm-access) * [npm config](/commands/npm-config)"), a
    navigation line, not a statement. A sentence with a link in it ("see [the guide](...)
    first") is prose. ``masked``: ``mask_markup(text)`` where the caller has it."""
    linked = sum(ch.isalpha() for m in _LINK_TEXT.finditer(text) for ch in str(m.group(1)))
    if not linked:
        return False
    return linked >= 0.5 * sum(ch.isalpha() for ch in (masked if masked is not None
                                                        else mask_markup(text)))


_WORDS = re.compile(r"[^\W\d_]{2,}")


def says_more_than(text: str, name: str, masked: str | None = None) -> bool:
    """Whether a sentence says something beyond ``name``: two words or more once the name is
    taken out. A table of contents' "[Long Term Support](#long-term-support)" is where the
    name is mentioned, and a profile of it read "Long Term Support: Long Term Support. ..."."""
    rest = mask_markup(text) if masked is None else masked
    if name:
        rest = re.sub(re.escape(name), " ", rest, flags=re.I)
    return len(_WORDS.findall(rest)) >= 2


def plausible_statement(text: str, masked: str | None = None) -> bool:
    """Whether a claim's sentence is prose worth summarising (three words or more, no junk,
    no list of links). ``masked``: ``mask_markup(text)`` where the caller has it."""
    masked = mask_markup(text) if masked is None else masked
    return (len(re.findall(r"[A-Za-z]{2,}", masked)) >= 3 and junk_reason(masked) is None
            and not link_list(text, masked))


def prose_or_all(sentences: Sequence[_S], written: Callable[[_S], str] = str) -> list[_S]:
    """The ``sentences`` that are prose (``plausible_statement`` of each one's ``written``
    text), or all of them when none is: what a RAPTOR leaf and a community are summarised
    from (stop 49), so a group of code or property lines still gets a summary."""
    prose = [x for x in sentences if plausible_statement(written(x))]
    return prose or list(sentences)
