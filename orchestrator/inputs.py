"""What every value from outside must be before Engram acts on it: one set of rules, one place.

Engram's entry points (the GraphQL request, MCP tool arguments, the command line)
and its floor (every statement sent to PostgreSQL) check values with the functions
here, so a bad value is refused the same way wherever it comes in, as
``BAD_USER_INPUT`` with a message that names the value and the problem, before
anything is written:

* **text** must be storable: no NUL character (PostgreSQL text cannot hold U+0000)
  and no lone UTF-16 surrogate (U+D800..U+DFFF: not Unicode, cannot be encoded as
  UTF-8; a JSON body can carry one as ``"\\ud800"``);
* **numbers** must be finite (a JSON body parsed by Python may carry ``NaN`` or
  ``Infinity``), and integers fit a signed 32-bit integer, GraphQL's ``Int``
  (``int_problem``; the MCP tools take the same ints as the GraphQL fields);
* **structure** is at most ``MAX_NESTING`` levels of lists and objects deep: a
  request nested 100,000 deep costs recursion everywhere it is read, and no
  Engram input needs more than a few levels.
* **named values** (a status, a strategy, a kind) are one of the values their rows
  can hold (``one_of``): a filter on an unknown one is refused, not answered with
  an empty list.

``check_value`` walks a parsed value (variables, tool arguments, JSON metadata)
and raises ``BadInput`` naming every problem by its path (``input.title``);
``parse_json`` reads a request body under the same rules; ``guard_engine``
installs the text rule on an engine, so a value that reached the database by
any other way (a file, the Python client, a cursor) is refused as bad input
instead of failing inside the driver.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from orchestrator.errors import BadInput

if TYPE_CHECKING:
    from sqlalchemy import Engine

MAX_NESTING = 64
# Control characters that are not layout (C0 but tab, newline and carriage return; DEL; C1):
# storable, but no prose, and able to drive a terminal that prints them.
CONTROL_CHARACTERS = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
# Problems listed in one refusal; the rest are counted.
MAX_LISTED = 5
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile(CONTROL_CHARACTERS)
_LAYOUT = re.compile(r"[\t\n\r]")
_LINE_BREAK = re.compile(r"\r\n?")


def unix_lines(text: str) -> str:
    r"""``text`` with its line breaks as ``\n``: a Windows ``\r\n`` and an old Mac's lone
    ``\r`` alike. Every reader of a document's text (chunker, excerpt cutter, front matter,
    titles, the rendered recall) cuts at ``\n``; a CRLF file's lines all ended in ``\r``, so
    none ended a sentence for the chunker, and the rendered recall carried the ``\r``s."""
    return _LINE_BREAK.sub("\n", text) if "\r" in text else text


def name_problem(what: str, value: str, limit: int, *, layout: bool = False,
                 edge_spaces: bool = False) -> str | None:
    """What is wrong with ``value`` as a one-line name of at most ``limit`` characters (the
    check a column's length rule makes, said with the value's name), or ``None``. ``layout``:
    tabs and line breaks are allowed (a description), and so is an empty value; otherwise a
    name holds no control character at all. ``edge_spaces``: spaces may begin or end it (a
    file's name may)."""
    if not 1 <= len(value) <= limit and not (layout and not value):
        return f"{what} must be 1 to {limit:,} characters (got {len(value):,})"
    found = _CONTROL.search(value) or (None if layout else _LAYOUT.search(value))
    if found is not None:
        return f"{what} contains a control character (U+{ord(found.group()):04X})"
    if not (layout or edge_spaces) and value != value.strip():
        return f"{what} {value!r} begins or ends with a space"
    return None


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text, or None when it can."""
    if "\x00" in value:
        return "contains a NUL character (U+0000), which cannot be stored"
    found = _SURROGATE.search(value)
    if found is not None:
        return (f"contains a lone UTF-16 surrogate (U+{ord(found.group()):04X}), which is not "
                "valid Unicode")
    return None


def int_problem(value: int) -> str | None:
    if not INT_MIN <= value <= INT_MAX:
        return f"is {value}, outside the 32-bit integer range {INT_MIN}..{INT_MAX}"
    return None


def problems(value: Any, path: str, *, check_ints: bool = False) -> Iterator[str]:
    """Every problem of ``value`` (and what it contains), each prefixed with its path."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        v, where, depth = stack.pop()
        name = where or "the value"
        if isinstance(v, str):
            problem = text_problem(v)
            if problem:
                yield f"{name} {problem}"
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            problem = int_problem(v) if check_ints else None
            if problem:
                yield f"{name} {problem}"
        elif isinstance(v, float):
            if not math.isfinite(v):
                yield f"{name} is {v!r}, not a finite number"
        elif isinstance(v, (dict, list, tuple)):
            if depth >= MAX_NESTING:
                yield f"{name} is nested more than {MAX_NESTING} levels deep"
                continue
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for key, item in items:
                if isinstance(key, str):
                    problem = text_problem(key)
                    if problem:
                        yield f"{name} has a key that {problem}"
                label = (f"{where}[{key}]" if not isinstance(key, str)
                         else f"{where}.{key}" if where else key)
                stack.append((item, label, depth + 1))


def one_of(value: str | None, known: tuple[str, ...], what: str = "status") -> None:
    """``value`` (unless None) is one of ``known``, else ``BadInput`` naming the value and
    listing the known ones: a write's kind or strategy, and a list filter's status (an unknown
    one would match nothing, or reach the database as a type error, not a refusal)."""
    if value is not None and value not in known:
        raise BadInput(f"{what} {value!r} is not one of {', '.join(known)}")


def check_value(value: Any, path: str, *, check_ints: bool = False) -> None:
    """Refuse ``value`` with ``BadInput`` naming every problem (``path`` names the value)."""
    found = sorted(set(problems(value, path, check_ints=check_ints)))
    if found:
        more = f" (and {len(found) - MAX_LISTED} more)" if len(found) > MAX_LISTED else ""
        raise BadInput("; ".join(found[:MAX_LISTED]) + more)


def check_arguments(arguments: dict[str, Any], *, check_ints: bool = True) -> None:
    """A call's named arguments (an MCP tool's): each is named by its own name."""
    found = sorted({p for name, v in arguments.items()
                    for p in problems(v, name, check_ints=check_ints)})
    if found:
        more = f" (and {len(found) - MAX_LISTED} more)" if len(found) > MAX_LISTED else ""
        raise BadInput("; ".join(found[:MAX_LISTED]) + more)


class _Constant(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _Constant(name)


def parse_json(body: bytes | str, what: str = "the request body") -> Any:
    """JSON as the API accepts it: valid UTF-8, no NaN/Infinity, nested at most MAX_NESTING."""
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise BadInput(f"{what} is nested more than {MAX_NESTING} levels deep") from None
    except _Constant as exc:
        raise BadInput(f"{what} contains {exc}, which is not a JSON number") from None
    except ValueError:  # UnicodeDecodeError is a ValueError too
        raise BadInput(f"{what} is not valid JSON") from None
    # Members are named by their path inside the body (variables.input.title).
    check_value(value, "" if isinstance(value, dict) else what)
    return value


def _text_parameters(parameters: Any) -> Iterator[str]:
    """The text values of a statement's parameters (one dict, or a list of them)."""
    rows = parameters if isinstance(parameters, (list, tuple)) else [parameters]
    for row in rows:
        values = row.values() if isinstance(row, dict) else row if isinstance(row, (list, tuple)) else ()
        for v in values:
            if isinstance(v, str):
                yield v
            elif isinstance(v, (list, tuple)):
                yield from (x for x in v if isinstance(x, str))


def guard_engine(engine: Engine) -> Engine:
    """Refuse, before it is sent, a statement whose text parameters cannot be stored."""
    from sqlalchemy import event  # not at import: the CLI's checks need no SQLAlchemy

    @event.listens_for(engine, "before_cursor_execute")
    def _check(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        for value in _text_parameters(parameters):
            problem = text_problem(value)
            if problem:
                raise BadInput(f"a text value {problem}")

    return engine
