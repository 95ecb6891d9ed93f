"""``engram ingest PATH...``: Markdown, reStructuredText and text files into documents.

Where a file lands: a folder argument is a collection (the folder's name, or
``--collection``) and each file's path inside it, with ``/`` separators, is the
document path; a file argument lands in its parent folder's collection under
its own name. The title is the front matter's ``title``, else the first Markdown
heading, else the file name without extension.

Front matter is the ``---`` block at the top, in YAML (lists, nested keys, dates
and quoting as Jekyll, Hugo, Obsidian or a model card write it); a block that is
not YAML but is plain ``key: value`` lines (``title: Budget: Q3``) is read line by
line, as before. ``kind``, ``state``, ``area``, ``title``, ``date`` (ISO 8601, when
what the document describes happened; a date alone is midnight UTC) and ``scopes``
(``[a, b]``, a YAML list or ``a, b``) are used, other keys go to the document's
metadata (dates as ISO strings). The block is not part of the body, except the page's own
summary: ``description`` (Docusaurus, Hugo, Jekyll, MkDocs, npm's docs) or ``summary``
(Hugo) opens the body as its first paragraph (after a level-1 heading that opens it), so
recall finds and shows the page by the words its author summarised it with; it stays in
the metadata too, and a body whose first paragraph opens with it is left as it is. Without a
``date``, a file name that starts with a calendar date (``2026-12-01.md``, as
Obsidian's daily notes, Jekyll's posts ``2026-12-01-title.md`` and Logseq's
journals ``2026_12_01.md`` are named) dates the document at midnight UTC of that day.

A reStructuredText file (``.rst``, ``.rest``: Sphinx's and docutils' pages) is stored as
Markdown (``orchestrator.ingest.rst``): section titles as headings (the first is the title),
literal blocks and code directives as fenced code, admonitions as labelled paragraphs, roles
and links as their text, ``replace`` substitutions replaced; the field list that opens it
(``:date:``, ``:scopes:``, Sphinx's ``:orphan:``) is its front matter. ``.. include::`` is
followed to files inside the folder ingested (for a file argument, its own folder), never a
hidden one nor one outside it, four files deep at most.

A folder's hidden files and folders are never read, and its ``.gitignore`` files (and those
above it, up to the top of its git checkout) leave files out as git does; ``--no-ignore``
reads those.
Symbolic links inside a folder are left out and counted (``--follow-links`` reads them).
A file is UTF-8, or UTF-16/32 where its byte order mark says so; ``--encoding`` names what
the files that are not are written in. Line breaks become ``\n``. A file with no text is left
out and named, not a failure.

Each file is its own transaction, so one bad file is reported and skipped and
loses nothing of the others. Unchanged files write nothing (``put_document``
compares content hashes and fields). ``--sync`` deletes the documents of a
folder's collection whose file is gone; it never touches collections that were
not ingested as folders.

**Extraction.** By default it is handed to the worker: the command returns as
soon as the files are written and says how many chunks of the documents this run
created or changed wait for extraction (and how many of them for their embedding
first); a running ``engram worker run`` or ``engram up`` extracts them right after
embedding them (``orchestrator.derive.extract.ExtractOnIngest``). Extraction is the
slow part of ingesting (spaCy or GLiNER over every chunk): measured at 2,983 chunks,
minutes of it after 5.7 s of writing. ``--extract`` extracts them now instead, with
a progress bar, in runs of ``ENGRAM_DERIVE_EXTRACT_LIMIT`` chunks
(``orchestrator.derive.extract.extract_all``); a failure there is reported and exits
1, but the documents stay written and the worker extracts them later. Front matter
``extract: false`` (or ``--skip-extraction`` for every file of the run) stores
``"extract": false`` in the document's metadata: it is never extracted, and what was
extracted from it before is retracted (bring your own claims).
"""

from __future__ import annotations

import math
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import pathspec
import typer
import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import Engine, select

from orchestrator.auth import Identity
from orchestrator.cli.auth import cli_identity, parse_scopes
from orchestrator.cli.output import console, exit_status, styled
from orchestrator.config import Settings
from orchestrator.db.models import Document
from orchestrator.db.session import bound_session
from orchestrator.derive.quality import inline_text, mask_fences
from orchestrator.errors import BadInput, EngramError
from orchestrator.ingest.documents import DocumentInput, delete_document, put_document
from orchestrator.ingest.html import declared_charset, html_document, site_name, without_site_name
from orchestrator.ingest.rst import Includes, rst_document
from orchestrator.inputs import unix_lines
from orchestrator.markdown import ATX_LINE, SETEXT_UNDERLINE, WIKILINK, headings, title_line

# reStructuredText and HTML are stored as Markdown (``ingest.rst``, ``ingest.html``); the rest
# as written. Any of them may be gzip-compressed (``README.md.gz``: Debian ships its packages' docs so).
RST_SUFFIXES = (".rst", ".rest")
HTML_SUFFIXES = (".html", ".htm")  # stored as Markdown too (``ingest.html``)
SOURCE_SUFFIXES = (".md", ".markdown", ".txt", *RST_SUFFIXES)
SUFFIXES = (*SOURCE_SUFFIXES, *HTML_SUFFIXES)
# Files without a suffix that are text by their name, read as ``.txt`` (a project's or a
# Debian package's README and NEWS). Not among them: a licence, the same text in every
# project, and a ``ChangeLog``, mostly a dump of the version history (502 under
# /usr/share/doc, 113 MB; harfbuzz's alone 6.7 MB). A file named on the command line is
# read whatever its name.
TEXT_NAMES = frozenset({
    "readme", "news", "changes", "history", "install", "faq", "todo", "bugs", "authors",
    "contributors", "thanks", "hacking", "maintainers", "notes", "credits"})
GZIP_SUFFIX = ".gz"
# UTF-8 spends at most four bytes on a character: a file longer than four bytes for each
# character a document may hold cannot fit, and is refused unread.
BYTES_PER_CHAR = 4
# The byte order marks that name their encoding, (mark, codec); UTF-32's first: its
# little-endian mark opens with UTF-16's.
BYTE_ORDER_MARKS = ((b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
                    (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
_KEY = re.compile(r"^([A-Za-z_][\w-]*)\s*:\s*(.*)$")

out = console()
err = console(stderr=True)


class LeftOut(BadInput):
    """A file ingest leaves out and names in its summary, not a failure: ``what`` it is, in
    the summary's words."""

    what, plural = "file", "files"
    hint = ""


class EmptyFile(LeftOut):
    """A file with no text (nothing, blanks, or front matter alone): a vault's "Untitled.md"
    must not fail the run."""

    what, plural = "empty file", "empty files"


class Redirect(LeftOut):
    """An HTML page that sends its reader to another at once (``<meta http-equiv="refresh"
    content="0; URL=...">``): a built site's stub for a moved page."""

    what, plural = "HTML redirect page", "HTML redirect pages"

    def __init__(self, target: str) -> None:
        super().__init__(f"a redirect to {target}")


class NoIndex(LeftOut):
    """An HTML page whose ``<meta name="robots">`` says ``noindex``: what a built site keeps
    out of search (mdBook's ``print.html``, the whole book again, and its old-edition stubs;
    search and 404 pages), read with ``--include-noindex``."""

    what, plural = "HTML page marked noindex", "HTML pages marked noindex"
    hint = "--include-noindex reads them"


@dataclass(frozen=True)
class SourceFile:
    file: Path
    collection: str
    path: str

    @property
    def compressed(self) -> bool:
        return self.file.suffix.lower() == GZIP_SUFFIX

    @property
    def format_suffix(self) -> str:
        """The suffix that says what the text is (".md" for ``README.md.gz``)."""
        return format_suffix(self.file)

    @property
    def stem(self) -> str:
        """The file's name without the suffixes ("2026-12-01" for ``2026-12-01.md.gz``)."""
        return _stem(self.file)

    def read(self, max_chars: int, encoding: str | None = None) -> str:
        r"""The file's text (a byte order mark dropped), gzip decompressed where it is, line
        breaks as ``\n`` (``unix_lines``); a file (or a decompressed stream) past
        ``BYTES_PER_CHAR`` bytes a character of ``max_chars`` is refused without reading the
        rest. A UTF-16 or UTF-32 byte order mark says the encoding (Windows' Notepad saves
        "Unicode" as UTF-16); otherwise UTF-8, then an HTML page's ``<meta charset>``, then
        ``encoding`` (``--encoding``: what the files that are not UTF-8 are written in)."""
        try:
            data = self._bytes(BYTES_PER_CHAR * max_chars, max_chars)
        except OSError as exc:  # gone since the walk, unreadable: this file fails, not the run
            raise BadInput(f"cannot be read ({exc.strerror or exc})") from exc
        for bom, codec in BYTE_ORDER_MARKS:
            if data.startswith(bom):
                try:
                    return unix_lines(data[len(bom):].decode(codec))
                except UnicodeDecodeError as exc:
                    raise BadInput(f"not {codec.upper()} text though it opens with that byte "
                                   f"order mark ({exc.reason} at byte {exc.start + len(bom)})"
                                   ) from exc
        try:
            # utf-8-sig: a byte order mark (Windows editors write one) is no part of the text;
            # read as text it hid the front matter and the first heading (the title was the
            # file's name).
            return unix_lines(data.decode("utf-8-sig"))
        except UnicodeDecodeError as exc:
            declared = declared_charset(data) if self.format_suffix in HTML_SUFFIXES else None
            nul = data.find(b"\x00", 0, 8192)
            wide = encoding is not None and encoding.startswith(("utf-16", "utf-32"))
            if declared is None and nul >= 0 and not wide:  # binary in cp1252 too
                raise BadInput(f"not text (a NUL byte at byte {nul}: a binary file under a "
                               "text file's name?)") from exc
            if declared is None and encoding is None:
                raise BadInput(f"not UTF-8 text ({exc.reason} at byte {exc.start}: "
                               f"{_around(data, exc.start)}); if it is written in another "
                               "encoding, --encoding names it (e.g. --encoding cp1252 for "
                               "Windows' Western European text)") from exc
            declared = declared or encoding
        assert declared is not None  # refused above without either
        try:
            return unix_lines(data.decode(declared))  # an older page's own <meta charset>
        except UnicodeDecodeError as exc:
            said = "as its <meta> says" if declared != encoding else "as --encoding says"
            raise BadInput(f"not {declared} text, {said} ({exc.reason} at byte "
                           f"{exc.start})") from exc

    def head(self, size: int) -> bytes:
        """The first ``size`` bytes of what the file holds (decompressed where it is gzip);
        ``BadInput`` for a ``.gz`` that is no gzip, ``OSError`` where it cannot be read."""
        if not self.compressed:
            with open(self.file, "rb") as stream:
                return stream.read(size)
        import gzip
        import zlib

        with gzip.open(self.file, "rb") as stream:
            try:
                return stream.read(size)
            except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
                raise BadInput(f"not a readable gzip file ({exc})") from exc

    def _bytes(self, limit: int, max_chars: int) -> bytes:
        if self.compressed:
            data = self.head(limit + 1)
            if len(data) > limit:
                raise BadInput(f"decompresses to more than {limit:,} bytes: longer than a document "
                               f"may be ({max_chars:,} characters, max_document_chars); not read further")
            return data
        size = self.file.stat().st_size
        if size > limit:
            raise BadInput(f"{size:,} bytes: longer than a document may be ({max_chars:,} "
                           "characters, max_document_chars); not read")
        return self.file.read_bytes()


def _around(data: bytes, at: int) -> str:
    """The bytes around ``at`` as Python writes them (``b'R\\xe9union'``): what the reader
    looks for in the file."""
    return repr(data[max(0, at - 8):at + 8])


def check_encoding(name: str | None) -> str | None:
    """``--encoding``'s codec name as Python knows it, or ``BadInput`` naming the problem."""
    if name is None:
        return None
    import codecs

    try:
        info = codecs.lookup(name)
    except LookupError:
        raise BadInput(f"--encoding {name!r} is no text encoding Python knows (cp1252, "
                       "latin-1, shift_jis, gb18030, ...)") from None
    if not getattr(info, "_is_text_encoding", True):
        raise BadInput(f"--encoding {name!r} is no text encoding (it converts bytes to bytes)")
    return info.name


def _stem(file: Path) -> str:
    """``file``'s name without its format suffix and a ``.gz`` ("fs" for ``fs.md.gz``)."""
    name = file.name[:-len(GZIP_SUFFIX)] if file.suffix.lower() == GZIP_SUFFIX else file.name
    return Path(name).stem


def format_suffix(file: Path) -> str:
    """The suffix that says what ``file``'s text is, under a ``.gz`` (lower case); ".txt" for
    a file without one named as text is (``TEXT_NAMES``: "README", "NEWS.gz")."""
    suffixes = [x.lower() for x in file.suffixes]
    if len(suffixes) >= 2 and suffixes[-1] == GZIP_SUFFIX:
        return suffixes[-2]
    if not suffixes or suffixes == [GZIP_SUFFIX]:
        return ".txt" if _stem(file).lower() in TEXT_NAMES else file.suffix.lower()
    return file.suffix.lower()


@dataclass
class IngestSummary:
    files: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    chunks: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    # Files of the folders that are not Markdown, reStructuredText, HTML or text, by suffix (hidden
    # ones aside).
    left_out: Counter[str] = field(default_factory=Counter)
    ignored: int = 0  # files and folders .gitignore left out
    renderings: int = 0  # HTML pages left out for the source beside them
    links: int = 0  # symbolic links left out
    # Files read and left out, by their kind (``LeftOut``'s subclasses): EmptyFile: [paths].
    passed_over: dict[type[LeftOut], list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    changed_ids: list[uuid.UUID] = field(default_factory=list)  # created or changed: to extract


class _Ignores:
    """The ``.gitignore`` files that apply under a folder being ingested: those of the folders
    from the enclosing git checkout's top (the nearest folder above with a ``.git``) down to
    it, and those found inside as the walk goes. A deeper file's verdict wins, as in git."""

    def __init__(self, root: Path) -> None:
        self.specs: dict[Path, pathspec.GitIgnoreSpec] = {}
        top = root.resolve()
        above = [top, *top.parents]
        checkout = next((p for p in above if (p / ".git").exists()), None)
        if checkout is not None:
            for folder in above[1:above.index(checkout) + 1]:
                self.read(folder)

    def read(self, folder: Path) -> None:
        try:
            lines = (folder / ".gitignore").read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return  # none, or unreadable: nothing ignored by it
        self.specs[folder] = pathspec.GitIgnoreSpec.from_lines(lines)

    def ignored(self, path: Path, is_dir: bool) -> bool:
        for folder in (path.parent, *path.parent.parents):
            spec = self.specs.get(folder)
            if spec is not None:
                rel = path.relative_to(folder).as_posix() + ("/" if is_dir else "")
                verdict = spec.check_file(rel).include
                if verdict is not None:
                    return verdict
        return False


def _visible_files(root: Path, gitignore: bool = True, follow_links: bool = False
                   ) -> tuple[list[Path], int, list[str]]:
    """The files under ``root`` whose path below it has no hidden part, sorted, how many
    files and folders ``.gitignore`` left out (``gitignore``: honour it, as git does) and the
    paths below ``root`` of the symbolic links left out. A hidden folder (``.git``,
    ``.venv``) or an ignored one (Sphinx's ``_build``, ``node_modules``) is never entered: a
    checkout's history or build output can hold far more files than its documents, and
    copies of them. A link (to a file or a folder) is read only with ``follow_links``: a link
    in a notes folder to ``/etc/passwd`` or to a folder elsewhere put what it points to into
    the tenant's memory, and a link to a file beside it, a second copy of that file; followed,
    a folder already walked (a link to ``.`` or to a parent) is not entered again."""
    files: list[Path] = []
    ignores = _Ignores(root) if gitignore else None
    skipped = 0
    links: list[str] = []
    top = root.resolve()
    walked = {os.path.realpath(top)}
    for folder, dirs, names in os.walk(top, followlinks=follow_links):
        here = Path(folder)
        if ignores is not None and ".gitignore" in names:
            ignores.read(here)
        kept = [d for d in dirs if not d.startswith(".")]
        if ignores is not None:
            dropped = [d for d in kept if ignores.ignored(here / d, True)]
            skipped += len(dropped)
            kept = [d for d in kept if d not in dropped]
        if follow_links:
            fresh = []
            for d in kept:
                real = os.path.realpath(here / d)
                if real not in walked:
                    walked.add(real)
                    fresh.append(d)
            kept = fresh
        else:
            linked = [d for d in kept if (here / d).is_symlink()]
            links += [(here / d).relative_to(top).as_posix() for d in linked]
            kept = [d for d in kept if d not in linked]
        dirs[:] = kept
        for n in names:
            if n.startswith(".") or not (here / n).is_file():
                continue
            if not follow_links and (here / n).is_symlink():
                links.append((here / n).relative_to(top).as_posix())
                continue
            if ignores is not None and ignores.ignored(here / n, False):
                skipped += 1
                continue
            files.append(root / (here / n).relative_to(top))
    return sorted(files), skipped, sorted(links)


@dataclass
class Discovered:
    """What ``discover`` found: the files to ingest, for each folder's collection the paths
    it now has, the files left out because they are not Markdown, reStructuredText, HTML or
    text, by suffix, and how many files and folders ``.gitignore`` left out (hidden files and
    folders, whose names start with ".", are never read nor counted)."""

    files: list[SourceFile]
    folders: dict[str, set[str]]
    left_out: Counter[str]
    ignored: int = 0
    # HTML pages beside a page of the same name in a source format (Node.js ships fs.md and
    # fs.html): the rendering is left out, the source read.
    renderings: int = 0
    # Symbolic links in the folders, left out (``--follow-links`` reads them): for each
    # folder's collection, the paths of the links (``--sync`` keeps the documents at or below
    # them: a link left out is not a file gone).
    links: dict[str, list[str]] = field(default_factory=dict)


def discover(paths: list[Path], collection: str | None, *, gitignore: bool = True,
             follow_links: bool = False) -> Discovered:
    """The files of ``paths`` to ingest (``Discovered``); ``gitignore``: honour ``.gitignore``
    files in and above each folder, up to the top of its git checkout; ``follow_links``: read
    what the symbolic links inside the folders point to (a path given is read either way)."""
    found = Discovered([], {}, Counter())
    for root in paths:
        if root.is_dir():
            name = collection or root.resolve().name
            seen = found.folders.setdefault(name, set())
            files, ignored, links = _visible_files(root, gitignore, follow_links)
            found.ignored += ignored
            if links:
                found.links.setdefault(name, []).extend(links)
            sources = {(f.parent, _stem(f)) for f in files if format_suffix(f) in SOURCE_SUFFIXES}
            for f in files:
                rel = f.relative_to(root)
                if format_suffix(f) in HTML_SUFFIXES and (f.parent, _stem(f)) in sources:
                    found.renderings += 1
                elif format_suffix(f) in SUFFIXES:
                    found.files.append(SourceFile(f, name, rel.as_posix()))
                    seen.add(rel.as_posix())
                else:
                    found.left_out[f.suffix.lower() or "(no suffix)"] += 1
        elif root.is_file():
            found.files.append(SourceFile(root, collection or root.resolve().parent.name, root.name))
        else:
            raise BadInput(f"{root} is neither a file nor a folder")
    return found


def _rate(per_second: float) -> str:
    """"529", or "0.3" where a whole number would say 0."""
    return f"{per_second:.0f}" if per_second >= 10 else f"{per_second:.1f}"


def passed_over_line(passed_over: dict[type[LeftOut], list[str]], shown: int = 3) -> str:
    """"; 2 empty files left out (Untitled.md, todo.md)": the files read and left out
    (``LeftOut``), per kind, the first ``shown`` of each named."""
    parts = []
    for kind, paths in passed_over.items():
        names = ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more"
                                            if len(paths) > shown else "")
        parts.append(f"; {len(paths)} {kind.what if len(paths) == 1 else kind.plural} left out "
                     f"({names}" + (f"; {kind.hint}" if kind.hint else "") + ")")
    return "".join(parts)


def left_out_line(left_out: Counter[str]) -> str:
    """"; 6 files left out, not Markdown, reStructuredText, HTML or text (...): 6 .png" (the five
    commonest suffixes)."""
    total = sum(left_out.values())
    if not total:
        return ""
    kinds = sorted(left_out.items(), key=lambda kv: (-kv[1], kv[0] == "(no suffix)", kv[0]))
    shown = ", ".join(f"{n} {suffix}" for suffix, n in kinds[:5])
    more = f" and {len(kinds) - 5} more kinds" if len(kinds) > 5 else ""
    return (f"; {total} file{'s' if total != 1 else ''} left out, not Markdown, "
            f"reStructuredText, HTML or text ({', '.join(SUFFIXES)}, or a README, NEWS, ... "
            f"without a suffix; each also gzip-compressed as .gz): {shown}{more}")


def _list(value: Any) -> list[str]:
    """Front matter ``scopes``: a YAML list, ``[a, b]`` or ``a, b``."""
    if isinstance(value, list):
        return [str(v).strip() for v in value if v is not None and str(v).strip()]
    value = str(value or "").strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return [v.strip().strip("'\"") for v in value.split(",") if v.strip()]


def _plain(value: Any) -> Any:
    """A YAML value as JSON can hold it: dates and times as ISO 8601 strings, a float that is
    not finite as its text (jsonb has no NaN), keys as strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_plain(v) for v in value]
    if isinstance(value, date):  # datetime too
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _line_keys(lines: list[str]) -> tuple[dict[str, Any], int | None]:
    """The older reading of a block: ``key: value`` lines, comments and blanks. Returns the
    keys and the index of the first line that is none of those (None when every line is)."""
    keys: dict[str, Any] = {}
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _KEY.match(line.rstrip("\r\n"))
        if match is None:
            return keys, i
        keys[match.group(1).lower()] = match.group(2).strip().strip("'\"")
    return keys, None


def parse_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(front matter keys, lower case, with their values; body without the block); no block:
    ({}, text). YAML first; plain ``key: value`` lines that are not YAML (an unquoted colon
    in a value) as they were read before; anything else is refused with YAML's reason."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return {}, text
    end = next((i for i, line in enumerate(lines[1:], start=1) if line.strip() in ("---", "...")),
               None)
    if end is None:
        raise BadInput("front matter starts with '---' but never ends")
    block, body = lines[1:end], "".join(lines[end + 1:])
    try:
        data = yaml.safe_load("".join(block))
    except yaml.YAMLError as exc:
        keys, bad = _line_keys(block)
        if bad is None:
            return keys, body
        # Where: the problem's mark, else (at the end of the block) the construct it was in.
        marks = (getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None))
        line = next((m.line for m in marks if m is not None and 0 <= m.line < len(block)), None)
        # The block starts on the file's line 2.
        where = "" if line is None else f" at line {line + 2} ({block[line].strip()[:80]!r})"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BadInput(f"front matter is not YAML{where}: {problem}") from None
    if data is None:
        return {}, body
    if not isinstance(data, dict):
        # A list or a bare text: the block's first line that is not a key (line 2 is its first).
        bad = (_line_keys(block)[1] or 0) + 2
        raise BadInput(f"front matter line {bad} is not 'key: value': {lines[bad - 1].strip()!r} "
                       f"(the block reads as a YAML {'list' if isinstance(data, list) else 'text'}, "
                       "not keys with values)")
    return {str(k).lower(): _plain(v) for k, v in data.items()}, body


_YES = ("true", "yes", "on")
_NO = ("false", "no", "off")


def _extract_flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in _YES:
        return True
    if str(value).lower() in _NO:
        return False
    raise BadInput(f"front matter extract must be true or false, not {value!r}")


def _headings(body: str) -> Iterator[tuple[int, str]]:
    """(level, text as written) of each heading of ``body`` outside code blocks, in order
    (``markdown.headings`` over the body with its code blocks masked)."""
    return ((level, written) for _, level, written in headings(mask_fences(body)))


def text_title(body: str) -> str:
    """A plain text file's title: its first line where a blank line (or nothing) follows it
    and it reads as a title (``markdown.title_line``), not a sentence ("The read path", "Como
    a recuperação funciona" over their first paragraphs: such files were titled by their
    names, "read-path", "how-retrieval-works.pt", stop 50); "" otherwise. Markdown's
    headings say it there (``heading_title``); a Markdown paragraph is no title."""
    lines = body.lstrip("\r\n").split("\n", 2)
    rest_blank = len(lines) == 1 or not lines[1].strip()
    return lines[0].strip() if rest_blank and title_line(lines[0]) else ""


def heading_title(body: str, limit: int) -> str:
    """The first level-1 heading (outside code blocks; ATX or setext), else the first heading,
    as a reader sees it (``quality.inline_text``: badges, link targets and markup gone), cut
    at a word to ``limit`` characters with an ellipsis: a title the file's author never
    wrote as one must not refuse the file. Empty without a heading or when nothing but markup
    is in it."""
    first: str | None = None
    for level, written in _headings(body):
        text = inline_text(written)
        if not text:
            continue
        if level == 1:
            first = text
            break
        first = first or text
    title = first or ""
    if len(title) > limit:
        title = title[:limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:-") + "\u2026"
    return title


# Front matter keys that hold the page's own one-paragraph summary, the first one given wins.
SUMMARY_KEYS = ("description", "summary")
_SPACE = re.compile(r"\s+")
LINE_BREAKS = "\r\n"
_PARAGRAPH_BREAK = re.compile(r"\r?\n[ \t]*\r?\n")


def with_summary(body: str, meta: dict[str, Any]) -> str:
    """``body`` opened by the front matter's summary (``SUMMARY_KEYS``) as its first paragraph,
    after a level-1 heading that opens the body ("# Title", or "Title" over "===="); ``body``
    as it is when there is none (or it is no text: a list, a mapping) or the body's first
    paragraph already opens with it (whitespace and case aside: Jekyll's excerpt is often
    that paragraph itself)."""
    value = next((meta[k] for k in SUMMARY_KEYS if meta.get(k) not in (None, "")), None)
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return body
    summary = _SPACE.sub(" ", str(value)).strip()
    if not summary:
        return body
    rest = body.lstrip(LINE_BREAKS)
    lines = rest.split("\n", 2)
    atx = ATX_LINE.fullmatch(lines[0].rstrip(LINE_BREAKS))
    # The title the body opens with: "# Title", or "Title" over a line of "=" (setext).
    if atx is not None and len(atx.group(1)) == 1:
        head = 1
    elif (len(lines) > 1 and lines[0].strip()
          and (underline := SETEXT_UNDERLINE.fullmatch(lines[1].rstrip(LINE_BREAKS))) is not None
          and underline.group(1)[0] == "="):
        head = 2
    else:
        head = 0
    title = "\n".join(line.rstrip(LINE_BREAKS) for line in lines[:head])
    below = "\n".join(lines[head:]).lstrip(LINE_BREAKS) if head else rest
    lead = _PARAGRAPH_BREAK.split(below, maxsplit=1)[0]
    if _SPACE.sub(" ", lead).strip().casefold().startswith(summary.casefold()):
        return body
    parts = [title, summary, below] if head else [summary, rest]
    opened = "\n\n".join(part for part in parts if part)
    return opened if parts[-1] else opened + "\n"  # nothing below: the summary ends the body


def to_document(src: SourceFile, default_scopes: list[str], *, extract: bool | None = None,
                max_title_chars: int = 500, max_document_chars: int = 2_000_000,
                encoding: str | None = None, include_noindex: bool = False,
                site: str = "") -> DocumentInput:
    """The file as a document; ``extract=False`` marks it opted out unless its front matter says.
    A title in the front matter is taken as written (the write refuses one over the limit);
    without one, the first heading's text (``heading_title``), else a plain text file's title
    line (``text_title``), else the file's name. A file
    that cannot fit ``max_document_chars`` is refused before it is read (``SourceFile.read``;
    ``encoding``: what a file that is not UTF-8 is written in). A file with no text raises
    ``EmptyFile``, an HTML page that redirects at once ``Redirect``, one marked noindex
    ``NoIndex`` (unless ``include_noindex``). ``site``: the name the folder's HTML pages end
    their titles with (``html.site_name``), cut from this page's."""
    text = src.read(max_document_chars, encoding)
    if src.format_suffix in RST_SUFFIXES:
        # Includes are followed inside the folder ingested (the file's own for a file).
        includes = Includes(root=src.file.parents[len(PurePosixPath(src.path).parts) - 1],
                            source=src.file)
        fields, body = rst_document(text, includes)  # a leading field list is its front matter
        meta: dict[str, Any] = dict(fields)
        if not body.strip() and text.strip():
            raise BadInput("no text of its own: its directives generate the page (toctree, "
                           "...) or include files not followed"
                           + (f": {'; '.join(includes.skipped)}" if includes.skipped else ""))
    elif src.format_suffix in HTML_SUFFIXES:
        page, body = html_document(text)  # its <title> is the title
        if "redirect" in page:
            raise Redirect(page.pop("redirect"))
        if page.pop("noindex", False) and not include_noindex:
            raise NoIndex("marked noindex (<meta name=\"robots\">)")
        if site and "title" in page:
            page["title"] = without_site_name(page["title"], site)
        meta = dict(page)
        if not body.strip() and text.strip():
            raise BadInput("no text outside its navigation, scripts and styles (an HTML page "
                           "that its scripts fill in, or a frame set)")
    else:
        meta, body = parse_front_matter(text)
    if not body.strip():
        raise EmptyFile("no text" + (" below its front matter" if text.strip() else ""))
    title = (_text(meta.pop("title", None)) or heading_title(body, max_title_chars)
             or (text_title(body) if src.format_suffix == ".txt" else "") or src.stem)
    scopes = _list(meta.pop("scopes", "")) or default_scopes
    if not scopes:
        raise BadInput("no scopes: give --scope or a 'scopes:' front matter line")
    occurred = _moment(meta.pop("date", "")) or named_day(src.stem)
    extra: dict[str, Any] = {k: v for k, v in meta.items() if k not in ("kind", "state", "area", "extract")}
    if "extract" in meta:
        extra["extract"] = _extract_flag(meta["extract"])
    elif extract is False:
        extra["extract"] = False
    return DocumentInput(collection=src.collection, path=src.path, title=title.strip(),
                         body=with_summary(body, meta),
                         scopes=tuple(scopes), kind=_text(meta.get("kind")) or "note",
                         state=_text(meta.get("state")) or None, area=_text(meta.get("area")) or None,
                         metadata=extra or None, occurred_at=occurred)


def _text(value: Any) -> str:
    """A front matter value used as text (a YAML number or date included); None is "". One
    wikilink is the page it names (``markdown.WIKILINK``; Obsidian writes a link property quoted,
    `area: "[[Areas/Payments|Pay]]"`, which is "Payments"): the Area catalog listed
    "[[Payments]]" beside the area note "Payments"."""
    text = "" if value is None else str(value).strip()
    if (link := WIKILINK.fullmatch(text)) is not None and not link.group(1):
        page = link.group(2).strip().rsplit("/", 1)[-1]
        text = page[:-3] if page.lower().endswith(".md") else page
    return text.strip()


def _moment(value: Any) -> datetime | None:
    """Front matter ``date``: ISO 8601; a date alone or a naive time is taken as UTC."""
    value = _text(value)
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise BadInput(f"front matter date {value.strip()!r} is not an ISO 8601 date or time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# A calendar date at the start of a file name: 2026-12-01, 2026_12_01 or 2026.12.01, then
# the end of the name or anything but a digit ("2026-12-01-title", "2026-10-20 Heron review").
_NAMED_DAY = re.compile(r"(\d{4})([-_.])(\d{2})\2(\d{2})(?!\d)")


def named_day(stem: str) -> datetime | None:
    """The day a file's name starts with, at midnight UTC; None when it names none (or an
    impossible one: "2026-13-45" is a name, not a date)."""
    match = _NAMED_DAY.match(stem)
    if match is None:
        return None
    try:
        return datetime(int(match.group(1)), int(match.group(3)), int(match.group(4)), tzinfo=UTC)
    except ValueError:
        return None


def _site_names(files: list[SourceFile], head_bytes: int = 16384) -> dict[str, str]:
    """Per collection, the name its HTML pages end their ``<title>`` with, where most share
    one (``html.site_name``: "The Rust Programming Language"); read from each page's first
    ``head_bytes``."""
    heads: dict[str, list[bytes]] = {}
    for src in files:
        if src.format_suffix not in HTML_SUFFIXES:
            continue
        try:
            heads.setdefault(src.collection, []).append(src.head(head_bytes))
        except (OSError, BadInput):
            continue  # read again, and refused by name, when ingested
    return {name: site for name, pages in heads.items() if (site := site_name(pages))}


def ingest_paths(settings: Settings, engine: Engine, identity: Identity, paths: list[Path], *,
                 collection: str | None = None, scopes: list[str] | None = None,
                 sync: bool = False, skip_extraction: bool = False, gitignore: bool = True,
                 follow_links: bool = False, encoding: str | None = None,
                 include_noindex: bool = False,
                 found: Discovered | None = None,
                 on_file: Callable[[int], None] | None = None) -> IngestSummary:
    """Ingest ``paths``; ``on_file(chunks)`` is called once per file (progress). ``found``:
    what ``discover`` already found for them (the CLI walks the folders once, to size its
    progress bar), else they are walked here. A file with no text, an HTML redirect page and
    one marked noindex (unless ``include_noindex``) are left out and named in
    ``IngestSummary.passed_over``; a document written from one before stays as it was, except
    that ``sync`` deletes one of a redirect or noindex page (an emptied file may be a save
    under way)."""
    started = time.monotonic()
    if found is None:
        found = discover(paths, collection, gitignore=gitignore, follow_links=follow_links)
    folders = found.folders
    default_scopes = scopes if scopes is not None else (
        sorted(identity.write_scopes) if len(identity.write_scopes) == 1 else [])
    sites = _site_names(found.files)
    summary = IngestSummary(files=len(found.files), left_out=found.left_out, ignored=found.ignored,
                            renderings=found.renderings,
                            links=sum(len(v) for v in found.links.values()))
    for src in found.files:
        chunks = 0
        try:
            doc = to_document(src, default_scopes, extract=False if skip_extraction else None,
                              max_title_chars=settings.max_title_chars,
                              max_document_chars=settings.max_document_chars, encoding=encoding,
                              include_noindex=include_noindex,
                              site=sites.get(src.collection, ""))
            with bound_session(engine, identity) as session:
                result = put_document(session, doc, settings)
            chunks = result.chunks
            summary.chunks += chunks
            if result.changed:
                summary.changed_ids.append(result.document_id)
            if result.created:
                summary.created += 1
            elif result.changed:
                summary.updated += 1
            else:
                summary.unchanged += 1
        except LeftOut as why:
            summary.passed_over.setdefault(type(why), []).append(src.path)
            if not isinstance(why, EmptyFile):  # a redirect or noindex page is no document:
                folders.get(src.collection, set()).discard(src.path)  # --sync deletes it
        except EngramError as exc:
            summary.failed.append((str(src.file), str(exc)))
        if on_file:
            on_file(chunks)
    if sync:
        for name, present in folders.items():
            with bound_session(engine, identity) as session:
                stored = set(session.execute(
                    select(Document.path).where(Document.collection == name)).scalars())
            linked = found.links.get(name, [])
            for gone in sorted(stored - present):
                if any(gone == link or gone.startswith(link + "/") for link in linked):
                    continue  # under a link left out: not gone
                try:
                    with bound_session(engine, identity) as session:
                        delete_document(session, name, gone)
                    summary.deleted += 1
                except EngramError as exc:
                    summary.failed.append((f"{name}/{gone}", f"not deleted: {exc}"))
    summary.seconds = time.monotonic() - started
    return summary


class _Rate(TextColumn):
    """files/s and chunks/s of the task so far."""

    def __init__(self) -> None:
        super().__init__("")

    def render(self, task: Any) -> Any:
        from rich.text import Text

        elapsed = task.elapsed or 0.0
        if elapsed <= 0:
            return Text("")
        chunks = task.fields.get("chunks", 0)
        return Text(f"{task.completed / elapsed:.1f} files/s  {chunks / elapsed:.1f} chunks/s")


def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Markdown/text files and folders")],
    collection: Annotated[str | None, typer.Option(help="collection name (default: folder name)")] = None,
    scope: Annotated[list[str] | None, typer.Option(
        help="scope(s) for files without front matter scopes (repeatable)")] = None,
    sync: Annotated[bool, typer.Option("--sync", help="delete documents whose file is gone")] = False,
    extract: Annotated[bool, typer.Option(
        "--extract/--no-extract", help="extract the created and changed documents now, with a progress "
        "bar; by default the worker extracts them right after embedding them")] = False,
    skip_extraction: Annotated[bool, typer.Option(
        "--skip-extraction", help="never extract these documents (bring your own claims); front matter "
        "extract: true|false decides per file")] = False,
    no_ignore: Annotated[bool, typer.Option(
        "--no-ignore", help="read files and folders that .gitignore leaves out too (hidden ones "
        "never)")] = False,
    follow_links: Annotated[bool, typer.Option(
        "--follow-links", help="read the files and folders that symbolic links inside the folders "
        "point to (by default links are left out and counted)")] = False,
    include_noindex: Annotated[bool, typer.Option(
        "--include-noindex", help="read HTML pages whose <meta name=\"robots\"> says noindex too "
        "(by default left out and counted: a built site's print-all page, search page, old "
        "stubs)")] = False,
    encoding: Annotated[str | None, typer.Option(
        help="what files that are not UTF-8 are written in, e.g. cp1252 or latin-1 (UTF-8 files "
        "and files with a byte order mark are read as they are)")] = None,
    token: Annotated[str | None, typer.Option(envvar="ENGRAM_TOKEN", help="bearer token")] = None,
    tenant: Annotated[str | None, typer.Option(help="mint a dev-key token for this tenant")] = None,
    user: Annotated[str, typer.Option(help="user of a minted token")] = "dev",
    scopes: Annotated[str | None, typer.Option(help="scopes of a minted token, e.g. write:team")] = None,
) -> None:
    """Ingest Markdown, reStructuredText, HTML and text files, then extract what changed."""
    from orchestrator.db.engine import Database, make_app_engine

    settings = Settings()
    try:
        encoding = check_encoding(encoding)
        identity = cli_identity(settings, token=token, tenant=tenant, user=user, scopes=scopes)
        found = discover(paths, collection, gitignore=not no_ignore, follow_links=follow_links)
    except EngramError as exc:
        err.print(styled("error:", "red", f" {exc}"))
        raise typer.Exit(2) from exc
    engine = make_app_engine(Database(settings).app_url(), pool_size=2)
    chosen = [s for v in scope for s in parse_scopes(v)] if scope else None
    try:
        # A bar on a terminal only (as the other commands' bars): scripts and logs get the
        # summary line, which carries the rate.
        with Progress(TextColumn("ingesting"), BarColumn(), MofNCompleteColumn(), _Rate(),
                      TimeElapsedColumn(), console=err, transient=False,
                      disable=not err.is_terminal) as progress:
            task = progress.add_task("files", total=len(found.files), chunks=0)
            written = [0]

            def on_file(chunks: int) -> None:
                written[0] += chunks
                progress.update(task, advance=1, chunks=written[0])

            summary = ingest_paths(settings, engine, identity, paths, collection=collection,
                                   scopes=chosen, sync=sync, skip_extraction=skip_extraction,
                                   encoding=encoding, include_noindex=include_noindex,
                                   found=found, on_file=on_file)
        out.print(f"{summary.files} file{'' if summary.files == 1 else 's'} in "
                  f"{summary.seconds:.1f} s: {summary.created} created, "
                  f"{summary.updated} updated, {summary.unchanged} unchanged, {summary.deleted} deleted, "
                  f"{len(summary.failed)} failed; {summary.chunks} "
                  f"chunk{'' if summary.chunks == 1 else 's'} written"
                  + (f" ({_rate(summary.chunks / summary.seconds)} chunks/s)"
                     if summary.chunks and summary.seconds > 0 else "")
                  + left_out_line(summary.left_out)
                  + (f"; {summary.ignored} file{'s' if summary.ignored != 1 else ''} or folder"
                     f"{'s' if summary.ignored != 1 else ''} ignored by .gitignore (--no-ignore "
                     "reads them)" if summary.ignored else "")
                  + (f"; {summary.renderings} HTML page{'s' if summary.renderings != 1 else ''} "
                     "left out, the source beside each read instead (fs.html beside fs.md)"
                     if summary.renderings else "")
                  + passed_over_line(summary.passed_over)
                  + (f"; {summary.links} symbolic link{'s' if summary.links != 1 else ''} left "
                     "out (--follow-links reads what they point to)" if summary.links else ""))
        for where, why in summary.failed:
            err.print(styled("failed:", "red", f" {where}: {why}"))
        if extract:
            extracted = _extract(settings, engine, identity, summary.changed_ids)
        else:
            extracted = True
            if not skip_extraction:
                _handed_over(engine, identity, summary.changed_ids, settings)
    except EngramError as exc:
        err.print(styled("error:", "red", f" {exc}"))
        raise typer.Exit(1) from exc
    finally:
        engine.dispose()
    if summary.failed or not extracted:
        raise typer.Exit(1)


def _handed_over(engine: Engine, identity: Identity, document_ids: list[uuid.UUID],
                 settings: Settings) -> None:
    """Say what waits for the worker: the chunks of what this run wrote that extraction will
    read (or withdraw), and how many of them wait for their embedding first. A document whose
    title changed but not its text has none (unless it has front matter aliases). Chunks that
    need no embedding (only the front matter changed) woke a running worker's extraction when
    their document was written (``put_document``: ``PutResult.reread``)."""
    from orchestrator.derive.extract import waiting_chunks

    if not document_ids:
        return
    with bound_session(engine, identity) as session:
        chunks, unembedded, docs = waiting_chunks(session, document_ids, settings)
    if not chunks:
        return
    first = ("" if not unembedded else " (for its embedding first)" if chunks == 1 else
             f" ({unembedded} of them for their embedding first)")
    # Woken, the worker reads every waiting chunk, embedded or not.
    when = "right after embedding them" if chunks == unembedded else "at once"
    out.print(f"extraction handed to the worker: {chunks} chunk{'s' * (chunks != 1)} of {docs} "
              f"document{'s' * (docs != 1)} {'waits' if chunks == 1 else 'wait'}{first}; a "
              f"running `engram worker run` or `engram up` extracts them {when} "
              "(`engram ingest --extract` extracts now)")


def _extract(settings: Settings, engine: Engine, identity: Identity, document_ids: list[uuid.UUID]) -> bool:
    """Extract what this run created or changed; False (said) when extraction failed."""
    if not document_ids:
        return True
    from orchestrator.cli.progress import progress_bar
    from orchestrator.derive.extract import extract_all

    try:
        with progress_bar(err, "extracting", unit="chunks") as update:
            report = extract_all(lambda: bound_session(engine, identity), settings,
                                 document_ids=document_ids, on_progress=update)
    except EngramError as exc:
        err.print(styled("extraction failed:", "red", f" {exc}; the documents are stored and "
                         "`engram worker run` (or `engram derive extract`) extracts them later"))
        return False
    out.print(f"extracted {report.line()}")
    if report.notice:
        err.print(styled("note:", "yellow", f" {report.notice}"))
    return True


def remember(
    text: Annotated[str, typer.Argument(help="what to remember")],
    session_id: Annotated[str, typer.Option("--session", help="the conversation it belongs to")] = "cli",
    scope: Annotated[list[str] | None, typer.Option(help="scope(s) to share it into (repeatable)")] = None,
    ttl: Annotated[int, typer.Option(help="seconds it stays recallable")] = 86_400,
    decision: Annotated[bool, typer.Option(
        "--decision", help="mark it as a decision (recorded by the decision hook, in its scopes)")] = False,
    category: Annotated[str | None, typer.Option(help="a decision's category (with --decision)")] = None,
    token: Annotated[str | None, typer.Option(envvar="ENGRAM_TOKEN", help="bearer token")] = None,
    tenant: Annotated[str | None, typer.Option(help="mint a dev-key token for this tenant")] = None,
    user: Annotated[str, typer.Option(help="user of a minted token")] = "dev",
    scopes: Annotated[str | None, typer.Option(help="scopes of a minted token, e.g. write:team")] = None,
) -> None:
    """Remember a working-memory item for the token's user; prints its id."""
    from datetime import timedelta

    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.ingest.memory import add_working_memory

    settings = Settings()
    try:
        identity = cli_identity(settings, token=token, tenant=tenant, user=user, scopes=scopes)
    except EngramError as exc:
        err.print(styled("error:", "red", f" {exc}"))
        raise typer.Exit(2) from exc
    chosen = [s for v in scope for s in parse_scopes(v)] if scope else sorted(identity.write_scopes)
    engine = make_app_engine(Database(settings).app_url(), pool_size=1)
    try:
        with bound_session(engine, identity) as session:
            item = add_working_memory(session, session_id, text, chosen, ttl=timedelta(seconds=ttl),
                                      kind="decision" if decision else "note", category=category)
    except EngramError as exc:
        err.print(styled("error:", "red", f" {exc} ({exc.code})"))
        raise typer.Exit(exit_status(exc)) from exc
    finally:
        engine.dispose()
    what = " as a decision" if decision else ""
    out.print(f"remembered {item}{what} in session {session_id} ({', '.join(chosen)})")
