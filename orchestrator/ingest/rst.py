"""reStructuredText files as the Markdown the rest of ingest reads.

Sphinx and docutils projects (Python's own, pip's, most of PyPI's) write their documentation
in reStructuredText. ``engram ingest`` stores a ``.rst`` file as Markdown so that everything
downstream works on it as on a ``.md`` file: the title is the first section title, chunks
open at section titles, code blocks are fenced (a chunk never ends inside one) and recall
shows text a reader can read.

What the conversion does (line based, no parser of the whole language):

* **Section titles** (a line underlined, or over- and underlined, with one punctuation
  character repeated) become ATX headings; as in reStructuredText, the order in which the
  adornment styles first occur gives their levels (``#`` to ``######``). Transitions (a line
  of four or more adornment characters between blank lines) are dropped.
* **Literal blocks** (a paragraph ending ``::`` and the indented block after it) and the
  code directives (``code-block``, ``code``, ``sourcecode``, ``doctest``, ...) become fenced
  code blocks, the directive's language kept; ``text::`` reads ``text:``. A
  ``parsed-literal`` block is code whose references and roles read as their text.
* **Admonitions** (``note``, ``warning``, ``seealso``, ...) open their text with
  ``**Note:**``; ``versionadded``, ``versionchanged`` and ``deprecated`` with "New in
  version X:" and the like; a description directive (``option``, ``function``, a domain's
  ``py:class``) shows its signature as code. Directives that only lay out or generate
  a page (``toctree``, ``contents``, ``image``, ``raw``, ``include``, ``meta``, Sphinx
  extensions' generators) leave nothing but their own text; comments, hyperlink targets
  and substitution definitions are dropped.
* **Inline markup:** a role shows its text (``:doc:`Install <install>``` reads "Install";
  code roles such as ``:func:`` and ``:option:`` read as inline code, ``~a.b.c`` as ``c``;
  ``:pep:`8``` reads "PEP 8"); an embedded link ```` `text <https://...>`_ ```` becomes a
  Markdown link; ``#.`` list items are numbered ``1.``, ``2.``, ...
* **File-wide fields** (a field list that opens the file: ``:orphan:``, ``:date:``,
  ``:scopes:``) are the file's front matter and are read as a Markdown file's would be.

Tables, definition lists, line blocks and block quotes are kept as written: they read as
text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from textwrap import dedent

from orchestrator.markdown import SETEXT_UNDERLINE

# One adornment character (any printable ASCII that is not a letter, digit or space),
# repeated: a section title's under- or overline, or a transition.
_ADORNMENT = re.compile(r"([!-/:-@\[-`{-~])\1+")
# ".. " explicit markup: a directive, comment, target, footnote or substitution definition.
_EXPLICIT = re.compile(r"([ \t]*)\.\.(?:[ \t]+(.*))?$")
_DIRECTIVE = re.compile(r"([A-Za-z][\w:+.-]*)::(?:[ \t]+(.*))?$")
_FOOTNOTE = re.compile(r"\[([^\]\s]+)\][ \t]*(.*)$")
_FIELD = re.compile(r":([^:\s][^:]*):(?:[ \t]+(.*))?$")
_OPTION_LINE = re.compile(r"[ \t]*:[\w .-]+:(?:[ \t].*)?$")
_INCLUDE = re.compile(r"([ \t]*)\.\.[ \t]+include::[ \t]+(.+)$")
_OPTION = re.compile(r"[ \t]*:([\w-]+):(?:[ \t]+(.*))?$")
_REPLACE = re.compile(r"[ \t]*\.\.[ \t]+\|([^|]+)\|[ \t]+replace::(?:[ \t]+(.*))?$")
_SUBSTITUTION = re.compile(r"\|([^|\s](?:[^|]*[^|\s])?)\|(?!_)")
MAX_INCLUDE_DEPTH = 4
MAX_INCLUDED_CHARS = 2_000_000
_ENUMERATED = re.compile(r"^([ \t]*)#\.([ \t])")

_CODE = frozenset({"code-block", "code", "sourcecode", "doctest", "testcode", "testoutput",
                   "testsetup", "testcleanup", "ipython", "jupyter-execute", "productionlist",
                   "code-cell"})
_ADMONITIONS = {"note": "Note", "warning": "Warning", "tip": "Tip", "important": "Important",
                "caution": "Caution", "attention": "Attention", "danger": "Danger",
                "error": "Error", "hint": "Hint", "seealso": "See also", "todo": "To do"}
_VERSIONS = {"versionadded": "New in version", "versionchanged": "Changed in version",
             "deprecated": "Deprecated since version", "versionremoved": "Removed in version"}
# Description directives (Sphinx's, of any domain: ``py:function``): the signature as code.
_SIGNATURES = frozenset({"option", "cmdoption", "envvar", "function", "class", "method",
                         "classmethod", "staticmethod", "property", "attribute", "data",
                         "exception", "decorator", "describe", "object", "program", "confval",
                         "module", "type", "member", "macro", "struct", "var", "enum"})
# Directives that generate or lay out the page: nothing of them is text of the page.
_GENERATED = frozenset({"toctree", "contents", "index", "meta", "raw", "image", "include",
                        "literalinclude", "highlight", "tabularcolumns", "sectionauthor",
                        "codeauthor", "moduleauthor", "currentmodule", "default-role", "role",
                        "sectnum", "header", "footer", "title", "default-domain", "autosummary"})
# Containers: their content is text of the page, their arguments are not (a condition, a
# class name, an image's path, a module autodoc documents).
_CONTAINERS = frozenset({"only", "ifconfig", "container", "rst-class", "cssclass", "tabs",
                         "grid", "figure", "hlist", "compound", "epigraph", "highlights",
                         "pull-quote", "glossary"})

_LITERAL = re.compile(r"(``.+?``)", re.S)
_ROLE = re.compile(r":((?:[A-Za-z][\w+.-]*:)*[A-Za-z][\w+.-]*):`((?:[^`\\]|\\.)+)`")
_EMBEDDED = re.compile(r"`((?:[^`<>\\]|\\.)*?)\s*<([^<>`]+)>`__?")
_ESCAPED = re.compile(r"\\([^\sA-Za-z0-9])")
_NAMED_REF = re.compile(r"(?<![:\w`])`([^`]+)`__?(?![\w`])")
_TITLED = re.compile(r"(.*?)\s*<([^<>]+)>$", re.S)
_CODE_ROLES = frozenset({"code", "command", "file", "option", "envvar", "program", "samp",
                         "kbd", "literal", "makevar", "regexp", "mimetype", "dfn"})
_PY_ROLES = frozenset({"func", "class", "meth", "mod", "attr", "exc", "data", "const", "obj",
                       "type", "var", "macro", "member", "struct", "enum", "enumerator"})
_NUMBERED_ROLES = {"pep": "PEP", "rfc": "RFC"}


@dataclass
class Includes:
    """Where ``.. include::`` may read: files inside ``root`` (the folder being ingested),
    none of them hidden, the including file at ``source``. A path is relative to the file
    that includes it; one that opens with ``/`` is relative to ``root`` (Sphinx's source
    root). What was not followed, and why, is kept in ``skipped``."""

    root: Path
    source: Path
    skipped: list[str] = field(default_factory=list)
    read_chars: int = 0

    def path(self, target: str, base: Path) -> Path:
        """Where ``target`` points from a file in ``base``: ``/`` opens at ``root``."""
        return (self.root / target.lstrip("/")) if target.startswith("/") else base / target

    def read(self, target: str, base: Path) -> str | None:
        try:
            real, root = self.path(target, base).resolve(), self.root.resolve()
        except (OSError, RuntimeError):
            self.skipped.append(f"{target} (a symlink loop)")
            return None
        if not real.is_relative_to(root):
            self.skipped.append(f"{target} (outside the folder ingested)")
            return None
        if any(part.startswith(".") for part in real.relative_to(root).parts):
            self.skipped.append(f"{target} (a hidden file)")
            return None
        if not real.is_file():
            self.skipped.append(f"{target} (no such file)")
            return None
        try:
            # A character is at least a byte: a file past what is left is refused unread.
            if real.stat().st_size > MAX_INCLUDED_CHARS - self.read_chars:
                self.skipped.append(f"{target} (past {MAX_INCLUDED_CHARS:,} included characters)")
                return None
            text = real.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError):
            self.skipped.append(f"{target} (not readable as UTF-8 text)")
            return None
        self.read_chars += len(text)
        return text


def rst_document(text: str, includes: Includes | None = None) -> tuple[dict[str, str], str]:
    """The file-wide fields of a reStructuredText text and its body as Markdown. With
    ``includes``, ``.. include::`` directives are replaced by the files they name, as far
    as ``includes`` allows; without, they leave nothing."""
    lines = _lines(text)
    fields, start = _file_fields(lines)
    body = lines[start:]
    if includes is not None:
        body = _included(body, includes, includes.source.parent, 0)
    body = _substituted(body)
    return fields, _tidy(_inline_paragraphs(_Converter().block(body)))


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").expandtabs(8).split("\n")


def _included(lines: list[str], includes: Includes, base: Path, depth: int) -> list[str]:
    """``lines`` with each ``.. include::`` replaced by its file's lines (indented as the
    directive; ``:literal:`` as a literal block; ``:start-after:`` and ``:end-before:`` cut
    it), to ``MAX_INCLUDE_DEPTH`` files deep."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _INCLUDE.match(lines[i])
        if match is None:
            out.append(lines[i])
            i += 1
            continue
        indent, target = match.group(1), match.group(2).strip()
        end = _block_end(lines, i + 1, len(indent))
        options = {m.group(1): (m.group(2) or "").strip()
                   for m in (_OPTION.match(line) for line in lines[i + 1:end]) if m}
        i = end
        if target.startswith("<") and target.endswith(">"):
            includes.skipped.append(f"{target} (docutils' standard definitions)")
            continue
        if depth >= MAX_INCLUDE_DEPTH:
            includes.skipped.append(f"{target} (more than {MAX_INCLUDE_DEPTH} includes deep)")
            continue
        text = includes.read(target, base)
        if text is None:
            continue
        if options.get("start-after") and options["start-after"] in text:
            text = text.split(options["start-after"], 1)[1]
        if options.get("end-before") and options["end-before"] in text:
            text = text.split(options["end-before"], 1)[0]
        inner = _lines(text)
        if "literal" in options or "code" in options:
            out.extend(["", indent + "::", "", *(indent + "    " + line for line in inner), ""])
        else:
            out.extend(indent + line if line else line for line in _included(
                inner, includes, includes.path(target, base).parent, depth + 1))
    return out


def _substituted(lines: list[str]) -> list[str]:
    """``|name|`` replaced by the text of its ``.. |name| replace::`` definition (definitions
    may use others, a few levels deep); other substitutions stay as written."""
    definitions: dict[str, str] = {}
    i = 0
    while i < len(lines):
        match = _REPLACE.match(lines[i])
        if match is None:
            i += 1
            continue
        end = _block_end(lines, i + 1, _indent(lines[i]))
        text = " ".join([match.group(2) or "", *(line.strip() for line in lines[i + 1:end])]).strip()
        definitions[match.group(1)] = text
        i = end
    if not definitions:
        return lines

    def one(found: re.Match[str]) -> str:
        return definitions.get(found.group(1), found.group(0))

    out = []
    for line in lines:
        if not _REPLACE.match(line):
            for _ in range(4):
                replaced = _SUBSTITUTION.sub(one, line)
                if replaced == line:
                    break
                line = replaced
        out.append(line)
    return out


def _inline_paragraphs(lines: list[str]) -> list[str]:
    """``inline`` over each paragraph outside code blocks: a role or a link may go on over
    a line break, never over a blank line."""
    out: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.extend(inline("\n".join(paragraph)).split("\n"))
            paragraph.clear()

    for line, code in _code_lines(lines):
        if code:
            flush()
            out.append(line)
        elif line.strip():
            paragraph.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return out


def _code_lines(lines: list[str]) -> Iterator[tuple[str, bool]]:
    """Each line and whether it is part of a fenced code block (its fences included), as the
    conversion writes them (``_fenced``: three or four backticks at the line's start)."""
    fence = ""
    for line in lines:
        if fence:
            yield line, True
            fence = "" if line.rstrip() == fence else fence
        elif line.startswith("```"):
            fence = "````" if line.startswith("````") else "```"
            yield line, True
        else:
            yield line, False


def _file_fields(lines: list[str]) -> tuple[dict[str, str], int]:
    """The field list that opens the file (Sphinx's file-wide metadata) and where the rest
    starts; a field's value may go on over indented lines."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    while i < len(lines):
        match = _FIELD.match(lines[i])
        if match is None:
            break
        value = [match.group(2) or ""]
        i += 1
        while i < len(lines) and lines[i][:1] in (" ", "\t") and lines[i].strip():
            value.append(lines[i].strip())
            i += 1
        fields[match.group(1).strip().lower()] = " ".join(v for v in value if v).strip()
    return fields, i


def _tidy(lines: list[str]) -> str:
    """Trailing spaces off, runs of blank lines as one outside code blocks, no blank lines at
    either end."""
    out: list[str] = []
    for line, code in _code_lines(lines):
        line = line.rstrip()
        if line or code or (out and out[-1]):
            out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n" if out else ""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_adornment(line: str) -> bool:
    """A line of one punctuation character repeated, from the first column ("::" is the
    literal block marker, never an adornment)."""
    stripped = line.rstrip()
    return stripped != "::" and _ADORNMENT.fullmatch(stripped) is not None


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """The end of the block that starts at ``start``: the lines blank or indented past
    ``indent``, the trailing blank ones left out."""
    end = start
    i = start
    while i < len(lines):
        if lines[i].strip():
            if _indent(lines[i]) <= indent:
                break
            end = i + 1
        i += 1
    return end


def _dedented(lines: list[str]) -> list[str]:
    return dedent("\n".join(lines)).split("\n") if lines else []


def _fenced(lines: list[str], language: str = "") -> list[str]:
    body = _dedented(lines)
    while body and not body[0].strip():
        body.pop(0)
    while body and not body[-1].strip():
        body.pop()
    if not body:
        return []
    fence = "````" if any(line.lstrip().startswith("```") for line in body) else "```"
    return ["", fence + language, *body, fence, ""]


class _Converter:
    def __init__(self) -> None:
        self.styles: list[tuple[str, bool]] = []  # adornment styles in order of first use
        self.counters: dict[int, int] = {}  # the open auto-numbered lists: indent -> items

    def heading(self, title: str, style: tuple[str, bool]) -> list[str]:
        if style not in self.styles:
            self.styles.append(style)
        level = min(self.styles.index(style) + 1, 6)
        return ["", "#" * level + " " + title.strip(), ""]

    def block(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        i, n = 0, len(lines)
        while i < n:
            line = lines[i]
            stripped = line.strip()
            if not stripped:
                out.append("")
                i += 1
                continue
            indent = _indent(line)
            after_blank = not out or not out[-1].strip()
            explicit = _EXPLICIT.match(line)
            if explicit is not None:
                end = _block_end(lines, i + 1, indent)
                out.extend(self.explicit(explicit.group(2) or "", lines[i + 1:end]))
                i = end
                continue
            if (indent == 0 and after_blank and _is_adornment(line) and i + 2 < n
                    and lines[i + 1].strip() and not _is_adornment(lines[i + 1])
                    and lines[i + 2].strip() == stripped):
                out.extend(self.heading(lines[i + 1], (stripped[0], True)))
                i += 3
                continue
            if (indent == 0 and after_blank and i + 1 < n
                    and not _is_adornment(line) and _is_adornment(lines[i + 1])
                    and (len(lines[i + 1].strip()) >= len(stripped)
                         or len(lines[i + 1].strip()) >= 4)):
                out.extend(self.heading(stripped, (lines[i + 1].strip()[0], False)))
                i += 2
                continue
            if indent == 0 and after_blank and _is_adornment(line) and len(stripped) >= 4 \
                    and (i + 1 >= n or not lines[i + 1].strip()):
                i += 1  # a transition
                continue
            if stripped.endswith("::"):
                end = _block_end(lines, i + 1, indent)
                if end > i + 1:
                    lead = line.rstrip()[:-2]
                    if lead.strip():
                        out.append(lead.rstrip() if lead.endswith((" ", "\t")) else lead + ":")
                    out.extend(_fenced(lines[i + 1:end]))
                    i = end
                    continue
            if SETEXT_UNDERLINE.fullmatch(line) and not after_blank:
                line = "\\" + line.lstrip()  # no title here: Markdown must not read one either
            out.append(self.numbered(line, indent))
            i += 1
        return out

    def numbered(self, line: str, indent: int) -> str:
        """An auto-numbered item (``#.``) with its number, counted among the items of its
        list: a line at or left of a list's indent that is no item of it ends the list."""
        for deeper in [k for k in self.counters if k >= indent]:
            if deeper > indent or not _ENUMERATED.match(line):
                del self.counters[deeper]
        if not _ENUMERATED.match(line):
            return line
        self.counters[indent] = self.counters.get(indent, 0) + 1
        return _ENUMERATED.sub(rf"\g<1>{self.counters[indent]}.\g<2>", line, count=1)

    def explicit(self, rest: str, body: list[str]) -> list[str]:
        """A ``..`` construct: what of it is text of the page."""
        directive = _DIRECTIVE.match(rest)
        if directive is None:
            footnote = _FOOTNOTE.match(rest)
            if footnote is not None and not rest.startswith("_"):
                text = " ".join([footnote.group(2), *(b.strip() for b in body)]).strip()
                return ["", f"[{footnote.group(1)}] {text}".rstrip(), ""]
            return []  # a comment, a hyperlink target, an anonymous target
        if rest.startswith("|"):
            return []  # a substitution definition
        name = directive.group(1).lower()
        args = (directive.group(2) or "").strip()
        content = list(body)
        while content and _OPTION_LINE.match(content[0]):
            content.pop(0)
        short = name.rsplit(":", 1)[-1]
        if name == "parsed-literal":  # code whose inline markup is read: references as text
            return _fenced([_ESCAPED.sub(r"\1", _inline_text(line)) for line in content])
        if short in _CODE or name in _CODE:
            language = "" if name in ("doctest", "testoutput") else args.split(" ")[0]
            return _fenced(content, language)
        if name in _ADMONITIONS or name == "admonition":
            label = _ADMONITIONS.get(name) or args
            said = content if name == "admonition" else [args, *content] if args else content
            return self.labelled(f"**{label}:**", said)
        if name in _VERSIONS:
            version, _, note = args.partition(" ")
            return self.labelled(f"*{_VERSIONS[name]} {version}:*", [note, *content] if note else content)
        if short in _GENERATED:
            return []
        if short in _SIGNATURES:
            return ["", f"`{args}`" if args else "", *self.block(_dedented(content)), ""]
        shown = self.block(_dedented(content))
        if not any(line.strip() for line in shown):
            shown = []
        if args and (name in ("rubric", "centered") or shown) and short not in _CONTAINERS \
                and not short.startswith("auto"):
            return ["", f"**{args}**", "", *shown, ""]
        return ["", *shown, ""] if shown else []

    def labelled(self, label: str, lines: list[str]) -> list[str]:
        """``label`` opening the first paragraph of ``lines`` (its own line when that is no
        paragraph: a code block, a list)."""
        converted = self.block(_dedented(lines) if lines and lines[0][:1] in (" ", "\t") else
                               [lines[0], *_dedented(lines[1:])] if lines else [])
        for k, line in enumerate(converted):
            if line.strip():
                if line.startswith(("```", "#", "-", "*", "+", "1.", " ", "[")):
                    converted.insert(k, label)
                    converted.insert(k + 1, "")
                else:
                    converted[k] = f"{label} {line}"
                break
        else:
            converted = [label]
        return ["", *converted, ""]


def inline(text: str) -> str:
    """A paragraph's inline markup as Markdown; ``literal`` spans are left as written
    (Markdown reads double backticks as code too)."""
    parts = _LITERAL.split(text)
    for k in range(0, len(parts), 2):
        parts[k] = _inline_text(parts[k])
    return "".join(parts)


def _inline_text(text: str) -> str:
    text = _ROLE.sub(_role, text)
    text = _EMBEDDED.sub(_embedded, text)
    text = _NAMED_REF.sub(r"\1", text)
    return text.replace("\\ ", "")


def _role(match: re.Match[str]) -> str:
    role = match.group(1).lower()
    short = role.rsplit(":", 1)[-1]
    text = match.group(2).replace("\\`", "`")
    titled = _TITLED.match(text)
    shown = titled.group(1) if titled is not None and titled.group(1) else (
        titled.group(2) if titled is not None else text)
    if short in _NUMBERED_ROLES:
        return f"{_NUMBERED_ROLES[short]} {shown}"
    if short in _PY_ROLES:
        shown = shown.lstrip("!.")
        if shown.startswith("~"):
            shown = shown[1:].rsplit(".", 1)[-1]
        return f"`{shown}`"
    if short in _CODE_ROLES:
        return f"`{shown}`"
    return shown


def _embedded(match: re.Match[str]) -> str:
    text, target = _ESCAPED.sub(r"\1", match.group(1).strip()), match.group(2).strip()
    if target.endswith("_"):  # a reference to a named target: its text
        return text or target[:-1]
    if not text:
        return target
    return f"[{text}]({target})"
