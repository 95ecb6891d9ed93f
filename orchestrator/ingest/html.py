"""HTML pages as the Markdown the rest of ingest reads.

Saved pages, exported wikis and built documentation (Texinfo's, DocBook's, Sphinx's, Node.js's
``api/*.html``) are HTML. ``engram ingest`` stores a ``.html`` file as Markdown so that
everything downstream works on it as on a ``.md`` file: the title is the page's ``<title>``
(else its first heading), chunks open at its headings, code is fenced and recall shows text a
reader can read, not markup.

What the conversion keeps (``html.parser`` from the standard library; no network, no
scripts run):

* **The page's content, not its furniture.** Where the page marks its content (``<main>``,
  ``<article>``, ``role="main"``), only that is read. Navigation and chrome are dropped
  wherever they are: ``nav``, ``header``, ``footer``, ``aside``, ``form``, scripts, styles,
  ``template``, SVG, elements ``hidden`` or ``aria-hidden`` (a ``header`` inside the content
  element is its own, read: MediaWiki's page title), the landmark roles of
  navigation, banner, footer and search, a code listing's line numbers (``LINE_NUMBERS``,
  ``data-nosnippet``), what the site's print style sheet hides (``PRINT_HIDDEN``: MediaWiki's
  ``noprint``), a citation's superscript "[1]", and elements whose class or id says navigation
  (``NAV_WORDS``, a word of the class or the whole id: Texinfo's ``div.header`` of
  Next/Previous/Up links, DocBook's
  ``navheader``, Sphinx's ``sphinxsidebar`` and the "¶" of its ``headerlink``, a ``toc``,
  MediaWiki's ``mw-editsection`` "[edit]", ``catlinks`` and ``printfooter``).
  The page's own ``html`` and ``body`` are never furniture by their class (mdBook's ``<html
  class="light sidebar-visible">`` says the sidebar is shown, not that the page is one), and
  a ``<main>`` is read wherever it is, inside an element dropped for its class too (the
  ``main`` element is the page's content by definition); nothing inside a heading is
  dropped for its class (mdBook writes each heading's text in an ``<a class="header">``; a
  permalink's "¶" or "#" is cut from the heading's end).
* **Structure:** ``h1``-``h6`` become ATX headings; ``pre`` a fenced code block (its text as
  written, a ``language-x`` class kept); ``code``, ``kbd``, ``samp`` and ``tt`` inline code;
  list items ``-`` or ``1.``, indented by nesting; a table of two rows and two columns or
  more a Markdown (GFM) table, its first row the header (a ``|`` in a cell escaped), and a
  table of one row or one column, or one with a heading, a list, a ``pre`` or another table in
  a cell, which lays a page out, its cells as blocks of their own (a 2000s page's layout
  table read as one line); every other block (``p``, ``div``, ``dt``, ``dd``, ...) a paragraph; a
  ``br`` a line break; links and emphasis their text; an image its ``alt`` text. Entities
  are decoded; whitespace outside ``pre`` is collapsed.
"""

from __future__ import annotations

import re
from collections import Counter
from html import unescape
from html.parser import HTMLParser
from typing import Any

# Elements read as nothing, with everything inside them.
DROPPED = frozenset({
    "script", "style", "noscript", "template", "svg", "math", "canvas", "iframe", "object",
    "nav", "header", "footer", "aside", "form", "button", "select", "textarea", "head",
    "dialog", "map"})
# Landmark roles of page furniture.
DROPPED_ROLES = frozenset({"navigation", "banner", "contentinfo", "search", "complementary"})
# Words of a class or id that mark navigation (split at spaces, "-" and "_").
NAV_WORDS = frozenset({
    "nav", "navbar", "navigation", "navheader", "navfooter", "header", "footer", "sidebar",
    "sphinxsidebar", "sphinxsidebarwrapper", "related", "breadcrumb", "breadcrumbs",
    "headerlink", "toc", "skip", "menu", "editsection", "catlinks", "printfooter"})
# Classes of a code listing's line numbers (Pygments' ``linenos``, highlight.js's line-numbers
# plugin), which read into the code ("1use crate::Span;"); rustdoc marks its with the
# ``data-nosnippet`` attribute that keeps text out of search snippets, dropped too.
LINE_NUMBERS = frozenset({"linenos", "linenodiv", "lineno", "line-number", "line-numbers",
                          "line-numbers-rows", "hljs-ln-numbers", "hljs-ln-n"})
# Classes a site's print style sheet hides (MediaWiki's ``noprint``: edit links, navigation
# boxes; Bootstrap's ``d-print-none``): what a printed page leaves out is furniture.
PRINT_HIDDEN = frozenset({"noprint", "no-print", "d-print-none", "hidden-print", "print-hidden"})
# Elements that never hold content (no end tag).
VOID = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
    "source", "track", "wbr"})
# Elements that start and end a block of text.
BLOCKS = frozenset({
    "p", "div", "section", "article", "main", "body", "ul", "ol", "dl", "dt", "dd", "li",
    "table", "thead", "tbody", "tfoot", "tr", "caption", "blockquote", "figure",
    "figcaption", "details", "summary", "address", "center", "fieldset", "legend", "hgroup"})
HEADINGS = {f"h{n}": n for n in range(1, 7)}
# Lists nested deeper are indented as this deep: each item's indent grew with its depth, so a
# page of nested lists ("<ul><li>x" 16,000 times, 144 kB) made a 256 MB document.
MAX_LIST_DEPTH = 8
# What in a table cell says the table lays the page out rather than holds data.
LAYOUT = frozenset({*HEADINGS, "table", "pre", "ul", "ol", "dl", "blockquote"})
INLINE_CODE = frozenset({"code", "kbd", "samp", "tt", "var"})
_MAIN = re.compile(r"<(?:main|article)\b|\brole\s*=\s*[\"']?main\b", re.IGNORECASE)
_SPACE = re.compile(r"\s+")
# A <meta http-equiv="refresh"> that sends the reader on at once: "0; URL=ch19-02.html".
_REFRESH = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*[;,]\s*(?:url\s*=\s*)?[\"']?([^\"'\s]+)",
                      re.IGNORECASE)
REFRESH_SECONDS = 5  # a refresh this soon is a redirect (a page reloading itself later is not)
_WORDS = re.compile(r"[\s\-_]+")
_CHARSET = re.compile(rb"""<meta[^>]*charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
# A heading's permalink sign, cut from its text where the link around it has no class that
# says navigation (Node.js's "## File system#").
_PERMALINK = re.compile(r"\s*[#¶§🔗]+$")
# One before the heading's text (rustdoc's "§Examples"); a leading "#" is left: it can be the
# heading's own ("#include").
_PERMALINK_BEFORE = re.compile(r"^[¶§🔗]+\s*")
# What stands between a page's heading and its site's name in its <title>.
_TITLE_SEPARATOR = re.compile(r"\s+[|\-–—·:»]\s+")
_TITLE_SEPARATOR_END = re.compile(_TITLE_SEPARATOR.pattern + "$")


def html_document(text: str) -> tuple[dict[str, Any], str]:
    """(fields, body): the page's ``<title>`` as the ``title`` field (when it has one) and its
    content as Markdown; a page whose ``<meta http-equiv="refresh">`` sends the reader to
    another address within ``REFRESH_SECONDS`` has that address as its ``redirect`` field (a
    built site's stub for a moved page), one whose ``<meta name="robots">`` says ``noindex``
    a true ``noindex`` field (ingest leaves both out). ``_MAIN`` is a cheap look for a content
    element in the raw text; where it matched only inside a script or a comment
    ("'<article>'" in a template string), the parse opened none, and the page is read again
    whole (it read as nothing, and ingest refused it as a page its scripts fill in)."""
    page = _Page(only_main=_MAIN.search(text) is not None)
    page.feed(text)
    page.close()
    if page.only_main and not page.found_main:
        page = _Page(only_main=False)
        page.feed(text)
        page.close()
    title = page.title
    fields: dict[str, Any] = {"title": title} if title else {}
    if page.redirect:
        fields["redirect"] = page.redirect
    if page.noindex:
        fields["noindex"] = True
    return fields, page.markdown()


_TITLE_TAG = re.compile(rb"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)
# A folder's pages share their site's name at the end of their <title> when most of them do:
# at least this many pages, and more than half of those with a title.
SITE_NAME_PAGES = 3


def site_name(heads: list[bytes]) -> str:
    """The name a folder's pages end their ``<title>`` with ("The Rust Programming Language"
    of "A - Keywords - The Rust Programming Language"), given each page's first bytes; "" when
    fewer than ``SITE_NAME_PAGES`` pages, or not more than half of those with a title, share
    one."""
    ends: Counter[str] = Counter()
    titled = 0
    for head in heads:
        found = _TITLE_TAG.search(head)
        if found is None:
            continue
        title = _SPACE.sub(" ", unescape(found.group(1).decode("utf-8", "replace"))).strip()
        titled += 1
        parts = _TITLE_SEPARATOR.split(title)
        if len(parts) > 1 and parts[-1]:
            ends[parts[-1]] += 1
    if not ends:
        return ""
    name, count = ends.most_common(1)[0]
    return name if count >= SITE_NAME_PAGES and 2 * count > titled else ""


def without_site_name(title: str, site: str) -> str:
    """``title`` without the site's name its folder's pages end their titles with, where
    something is left ("A - Keywords - The Rust Programming Language" is "A - Keywords")."""
    if not site or not title.endswith(site):
        return title
    head = title[:len(title) - len(site)]
    found = _TITLE_SEPARATOR_END.search(head)
    return head[:found.start()].strip() if found and head[:found.start()].strip() else title


def declared_charset(data: bytes) -> str | None:
    """The character set an HTML page's ``<meta>`` declares in its first 4 KB, where Python
    knows it ("iso-8859-1", "windows-1252", "shift_jis"); else None."""
    import codecs

    found = _CHARSET.search(data[:4096])
    if found is None:
        return None
    try:
        return codecs.lookup(found.group(1).decode("ascii")).name
    except LookupError:
        return None


def _language(attrs: dict[str, str | None]) -> str:
    """A code block's language from its class ("language-js", "lang-py", "highlight-sh")."""
    return next((c.split("-", 1)[1] for c in (attrs.get("class") or "").split()
                 if c.startswith(("language-", "lang-", "highlight-"))), "")


def _furniture(tag: str, attrs: dict[str, str | None]) -> str | None:
    """Why an element is page furniture ("element", "hidden", "role" or "class": the last a
    guess from its class or id words), or None where it is not."""
    if tag in DROPPED:
        return "element"
    if "hidden" in attrs or attrs.get("aria-hidden") == "true" or "data-nosnippet" in attrs:
        return "hidden"
    if (attrs.get("role") or "").strip().lower() in DROPPED_ROLES:
        return "role"
    if tag in ("html", "body"):
        return None  # their classes are the page's state ("sidebar-visible", "nav-open")
    classes = (attrs.get("class") or "").lower().split()
    if LINE_NUMBERS.intersection(classes) or PRINT_HIDDEN.intersection(classes):
        return "hidden"
    if tag == "sup" and "reference" in classes:
        return "hidden"  # a citation's "[1]" (MediaWiki), not text of the sentence
    # A class's words ("nav-wrapper", "sphinxsidebar"), but an id only whole ("toc",
    # "sidebar"): an id is often its heading's or section's slug, and "related-work" or
    # "using-structs-to-structure-related-data" dropped a section or its heading.
    # A table of contents' entries are "toc-<slug>" (Texinfo, pandoc).
    ident = (attrs.get("id") or "").lower()
    words = set(_WORDS.split((attrs.get("class") or "").lower()))
    words.update((ident, _WORDS.split(ident, maxsplit=1)[0] if ident.startswith("toc") else ""))
    return "class" if words & NAV_WORDS else None


def _code_span(held: str) -> str:
    """Inline code's text as Markdown: "`x`"; "`` a`b ``" where it holds a backtick (libxslt's
    "<code>CFLAGS=`xslt-config --cflags`</code>" read as broken spans); its blanks alone where
    it holds no text (an icon's empty ``<code>``)."""
    if not held.strip():
        return held
    return f"`` {held} ``" if "`" in held else f"`{held}`"


class _Page(HTMLParser):
    def __init__(self, *, only_main: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.only_main = only_main
        self.stack: list[str] = []
        self.open = Counter[str]()  # the stack's tags, counted: a stray end tag costs no scan
        self.dropped_at: int | None = None  # stack depth of the dropped element we are in
        self.dropped_for = ""  # why it is dropped (``_furniture``)
        self.suspended: list[tuple[int, int, str]] = []  # (main's depth, dropped_at, why)
        self.main_at: int | None = None  # stack depth of the content element we are in
        self.found_main = False  # whether a content element opened at all
        self.in_title = False
        self.redirect = ""  # where a <meta> refresh sends the reader at once
        self.noindex = False  # whether <meta name="robots"> keeps the page out of search
        self.title_parts: list[str] = []
        self.out: list[str] = []  # Markdown, block by block
        self.line: list[str] = []  # the block being written
        self.pre: list[str] | None = None  # the raw text of the pre being read
        self.pre_language = ""
        self.code = 0  # inline code depth
        # Where the open inline code's text starts: (True, in the cell) or (False, in line).
        self.code_at: tuple[bool, int] = (False, 0)
        # Per open list: [items so far, 1 if ordered, 1 once the item's marker is written].
        self.lists: list[list[int]] = []
        self.heading = 0
        self.first_h1 = ""
        self.first_heading = ""
        self.cells: list[str] | None = None
        # Per open table: its rows' cells so far, or None for a layout table (``LAYOUT``).
        self.tables: list[list[list[str]] | None] = []

    # -- where we are -------------------------------------------------------------------

    @property
    def reading(self) -> bool:
        return self.dropped_at is None and (not self.only_main or self.main_at is not None)

    @property
    def title(self) -> str:
        """The page's ``<title>``, or the heading it is with the site's name added: its first
        ``h1`` where the title holds it ("Installing — Widget 2.1 documentation" is
        "Installing"), its first heading of any level where the title opens with it before a
        separator (Node.js's "File system | Node.js v20.20.2 Documentation" under an ``h2``
        "File system"), as the title writes it: letter case and inline code marks aside
        (mdBook's "Recoverable Errors with Result - The Rust Programming Language" under
        "Recoverable Errors with `Result`" is "Recoverable Errors with Result"); without a
        ``<title>``, the first ``h1``."""
        title = _SPACE.sub(" ", "".join(self.title_parts)).strip()
        if self.first_h1 and (not title or (self.first_h1 in title and self.first_h1 != title)):
            return self.first_h1
        first = self.first_heading.replace("`", "")
        if (first and title.casefold().startswith(first.casefold())
                and _TITLE_SEPARATOR.match(title, len(first))):
            return title[:len(first)]
        return title

    # -- parser events ------------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k.lower(): v for k, v in attrs}
        if tag == "title" and not self.title_parts and not self.open["svg"]:
            self.in_title = True  # the page's; an inline SVG icon's <title> ("Copy") is not
        if tag == "meta" and (found.get("http-equiv") or "").lower() == "refresh":
            self._refresh(found.get("content") or "")
        if tag == "meta" and (found.get("name") or "").strip().lower() == "robots":
            self.noindex = self.noindex or "noindex" in _WORDS.split(
                (found.get("content") or "").lower().replace(",", " "))
        if tag in VOID:
            self._void(tag, found)
            return
        self.stack.append(tag)
        self.open[tag] += 1
        depth = len(self.stack)
        if self.dropped_at is None:
            why = _furniture(tag, found)  # the head too (its title aside)
            if why == "class" and self.heading and self.reading:
                why = None  # a heading's own text (mdBook's <h2><a class="header">Title</a>)
            elif tag == "header" and why == "element" and self.main_at is not None:
                why = None  # the content's own header: its title (MediaWiki's h1), a byline
            if why:
                self.dropped_at, self.dropped_for = depth, why
        elif tag == "main" and self.dropped_for == "class":  # read wherever it is
            self.suspended.append((depth, self.dropped_at, self.dropped_for))
            self.dropped_at = None
        if self.only_main and self.main_at is None and (
                tag in ("main", "article") or (found.get("role") or "").lower() == "main"):
            self.main_at = depth
            self.found_main = True
        if not self.reading:
            return
        if tag in LAYOUT and self.cells is not None and self.tables and self.tables[-1] is not None:
            self._layout()
        if tag in HEADINGS:
            self._block()
            self.heading = HEADINGS[tag]
        elif tag == "pre":
            self._block()
            self.pre = []
            self.pre_language = _language(found)
        elif tag in INLINE_CODE and self.pre is None:
            self.code += 1
            if self.code == 1:
                self._text("`")
                in_cell = bool(self.cells)
                self.code_at = (in_cell, len(self.cells[-1]) if self.cells and in_cell
                                else len(self.line))
        elif tag == "code" and self.pre is not None:  # a pre of several examples (mjs, cjs)
            if self.pre and not "".join(self.pre).endswith("\n"):
                self.pre.append("\n")
            if not self.pre_language:
                self.pre_language = _language(found)
        elif tag in ("ul", "ol"):
            self._block()
            self.lists.append([0, 1 if tag == "ol" else 0, 0])
        elif tag == "li":
            self._block()
            if self.lists:
                self.lists[-1][0] += 1
                self.lists[-1][2] = 0
        elif tag == "table":
            self._block()
            self.tables.append([])
        elif tag == "tr":
            self._block()
            self.cells = [] if not self.tables or self.tables[-1] is not None else None
        elif tag in ("td", "th"):
            if self.cells is not None:
                self.cells.append("")
            else:
                self._block()  # a layout table's cell
        elif tag in BLOCKS:
            self._block()

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        if tag in VOID or not self.open[tag]:
            return  # a stray end tag closes nothing
        while self.stack:
            depth = len(self.stack)
            open_tag = self._pop()
            self._close(open_tag, depth)
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title_parts.append(data)
            return  # the title is the document's, never its text
        if not self.reading:
            return
        if self.pre is not None:
            self.pre.append(data)
            return
        self._text(_SPACE.sub(" ", data))

    def _text(self, text: str) -> None:
        """Inline text into the table cell or the block being written."""
        if self.cells is not None and self.cells:
            self.cells[-1] += text
        else:
            self.line.append(text)

    def close(self) -> None:
        super().close()
        while self.stack:
            depth = len(self.stack)
            self._close(self._pop(), depth)
        self._block()

    def _pop(self) -> str:
        tag = self.stack.pop()
        self.open[tag] -= 1
        return tag

    # -- writing ------------------------------------------------------------------------

    def _refresh(self, content: str) -> None:
        found = _REFRESH.match(content)
        if found and float(found.group(1)) <= REFRESH_SECONDS and not found.group(2).startswith("#"):
            self.redirect = self.redirect or found.group(2)

    def _void(self, tag: str, attrs: dict[str, str | None]) -> None:
        if not self.reading or _furniture(tag, attrs):
            return
        if tag == "br":
            if self.pre is not None:
                self.pre.append("\n")
            elif self.cells:
                self.cells[-1] += " "
            else:
                self.line.append("\n")
        elif tag == "hr":
            self._block()
        elif tag == "img" and attrs.get("alt"):
            self.handle_data(f" {attrs['alt']} ")

    def _close(self, tag: str, depth: int) -> None:
        was_reading = self.reading
        if self.dropped_at == depth:
            self.dropped_at = None
        if self.suspended and self.suspended[-1][0] == depth:
            _, self.dropped_at, self.dropped_for = self.suspended.pop()
        if self.main_at == depth:
            self._block()
            self.main_at = None
        if not was_reading:
            return
        if tag in HEADINGS:
            self._block()
        elif tag == "pre" and self.pre is not None:
            code = "".join(self.pre).strip("\n")
            self.pre = None
            if code.strip():
                fence = "~~~" if "```" in code else "```"
                self.out.append(f"{fence}{self.pre_language}\n{code}\n{fence}")
        elif tag in INLINE_CODE and self.code:
            self.code -= 1
            if self.code == 0:
                self._close_code()
        elif tag in ("ul", "ol"):
            self._block()
            if self.lists:
                self.lists.pop()
        elif tag == "tr":
            cells = self._cells()
            self.cells = None
            rows = self.tables[-1] if self.tables else None
            if rows is not None:
                rows.append(cells)
            elif any(cells):  # a row outside any table (broken markup): one line
                self.out.append(" | ".join(cells))
            self._block()
        elif tag in ("td", "th") and self.cells is None:
            self._block()  # a layout table's cell
        elif tag == "table" and self.tables:
            rows = self.tables.pop()
            if rows is not None:
                self._table(rows)
        elif tag in BLOCKS:
            self._block()

    def _close_code(self) -> None:
        """End inline code: its text since the opening mark as a code span (``_code_span``),
        in the table cell or the block it opened in."""
        in_cell, at = self.code_at
        if in_cell and self.cells and 0 < at <= len(self.cells[-1]):
            cell = self.cells[-1]
            self.cells[-1] = cell[:at - 1] + _code_span(cell[at:])
        elif not in_cell and 0 < at <= len(self.line) and self.line[at - 1] == "`":
            self.line[at - 1:] = [_code_span("".join(self.line[at:]))]
        else:  # what it opened in was written out meanwhile
            self._text("`")

    def _cells(self) -> list[str]:
        return [_SPACE.sub(" ", c).strip() for c in (self.cells or [])]

    def _layout(self) -> None:
        """The innermost table lays the page out: its cells so far become paragraphs, and the
        rest of it is read as blocks."""
        rows = self.tables[-1] or []
        self.out.extend(c for r in [*rows, self._cells()] for c in r if c)
        self.tables[-1] = None
        self.cells = None

    def _table(self, rows: list[list[str]]) -> None:
        """A table's rows as a Markdown table, or, for one row or one column (a layout
        table), its cells as paragraphs."""
        rows = [r for r in rows if any(r)]
        width = max((len(r) for r in rows), default=0)
        if len(rows) < 2 or width < 2:
            self.out.extend(c for r in rows for c in r if c)
            return

        def row(cells: list[str]) -> str:
            cells = cells + [""] * (width - len(cells))
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        self.out.append("\n".join([row(rows[0]), "|" + " --- |" * width]
                                  + [row(r) for r in rows[1:]]))

    def _block(self) -> None:
        """End the block being written (its text, prefixed as a heading or list item)."""
        lines = [_SPACE.sub(" ", x).strip() for x in "".join(self.line).split("\n")]
        text = "\n".join(x for x in lines if x)
        text = text.strip()
        self.line = []
        heading, self.heading = self.heading, 0
        if not text:
            return
        if heading:
            words = _PERMALINK_BEFORE.sub("", _PERMALINK.sub("", _SPACE.sub(" ", text)))
            if heading == 1 and not self.first_h1:
                self.first_h1 = words
            if not self.first_heading:
                self.first_heading = words
            if words:
                self.out.append(f"{'#' * heading} {words}")
        elif self.lists:
            items, ordered, written = self.lists[-1]
            indent = "  " * min(len(self.lists) - 1, MAX_LIST_DEPTH)
            marker = f"{items}." if ordered else "-"
            under = "\n" + indent + " " * (len(marker) + 1)  # a line break stays in the item
            # The item's second paragraph is indented under its first, not a new item.
            opener = " " * len(marker) if written else marker
            self.lists[-1][2] = 1
            self.out.append(f"{indent}{opener} {text.replace(chr(10), under)}")
        else:
            self.out.append(text)

    def markdown(self) -> str:
        blocks = [b.rstrip() for b in self.out if b.strip()]
        return "\n\n".join(blocks) + ("\n" if blocks else "")
