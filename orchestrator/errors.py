"""Engram's one error hierarchy.

Every error a user can meet derives from ``EngramError``; each carries a stable
``code`` that the CLI prints and the GraphQL layer puts in ``extensions.code``.
SQLSTATEs from PostgreSQL are mapped to these classes in exactly one place,
``from_sqlstate``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, ClassVar

log = logging.getLogger("engram.errors")


class EngramError(Exception):
    """Base of every error Engram raises on purpose."""

    code: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate

    def __str__(self) -> str:
        return self.message


class BadInput(EngramError):
    code = "BAD_USER_INPUT"


class Unauthenticated(EngramError):
    code = "UNAUTHENTICATED"


class Forbidden(EngramError):
    code = "FORBIDDEN"


class Conflict(EngramError):
    code = "CONFLICT"


class NotFound(EngramError):
    code = "NOT_FOUND"


class Misconfigured(EngramError):
    """The settings cannot give a correct server (e.g. production without a token issuer)."""

    code = "CONFIG"


class Unavailable(EngramError):
    """The database cannot be reached right now (down, restarting, the link broke): retry.

    The message is always the same sentence: a driver's text names the server's host
    and port, which belong in the log, never in an answer."""

    code = "UNAVAILABLE"
    MESSAGE: ClassVar[str] = "the database is unavailable (it may be restarting); retry shortly"

    def __init__(self, message: str | None = None, *, sqlstate: str | None = None,
                 detail: str | None = None) -> None:
        super().__init__(message or self.MESSAGE, sqlstate=sqlstate)
        self.detail = detail


class TimedOut(EngramError):
    """A statement ran past its time limit (``recall_statement_timeout_ms`` for a recall) or
    an operator cancelled it: stopped, its transaction rolled back, nothing written."""

    code = "TIMEOUT"


class ServerError(EngramError):
    """The database server could not be started, stopped or reached."""

    code = "SERVER"


# SQLSTATE (or class prefix) -> error class. Longest match wins. Every errcode the
# migrations raise is here (a test reads db/versions and checks), and so are the
# built-in refusals a request can meet; anything else is INTERNAL on purpose.
_SQLSTATE_MAP: dict[str, type[EngramError]] = {
    "42501": Forbidden,  # insufficient_privilege, RLS WITH CHECK violations
    "23505": Conflict,  # unique_violation
    "23P01": Conflict,  # exclusion_violation
    "40001": Conflict,  # serialization_failure
    "40P01": Conflict,  # deadlock_detected
    "55000": Conflict,  # object_not_in_prerequisite_state: e.g. a conflict already resolved
    "55P03": Conflict,  # lock_not_available
    "55006": Conflict,  # object_in_use: a scope rows are still shared into (0093)
    "23503": BadInput,  # foreign_key_violation, and rows named that are not visible
    "23502": BadInput,  # not_null_violation
    "23514": BadInput,  # check_violation
    "22": BadInput,  # data exceptions: bad values, formats, ranges (22023 from Engram's functions)
    "54": BadInput,  # program_limit_exceeded: a value too large for an index or a tsvector
    "42P16": BadInput,  # invalid_table_definition: a table the provenance chain cannot attach to
    "P0001": BadInput,  # raise_exception: a PL/pgSQL refusal raised without its own code
    "P0002": NotFound,  # no_data_found raised by Engram functions
    "28": Unauthenticated,  # invalid authorization specification
    "08": Unavailable,  # connection exceptions: refused, broken, failed
    "57P01": Unavailable,  # admin_shutdown: the server is stopping
    "57P02": Unavailable,  # crash_shutdown
    "57P03": Unavailable,  # cannot_connect_now: the server is starting or recovering
    "57014": TimedOut,  # query_canceled: statement_timeout, or pg_cancel_backend
}

# Why a connection-class failure happened, in words that name no host or port.
_UNAVAILABLE_WHY = {"57P01": "the server is shutting down", "57P02": "the server crashed",
                    "57P03": "the server is starting up", "08006": "the connection was lost",
                    "08001": "the connection was refused", "08004": "the server refused the connection"}


# The HTTP status of each code, for every HTTP surface (GraphQL's transport, REST, the console).
STATUS_BY_CODE = {"UNAUTHENTICATED": 401, "FORBIDDEN": 403, "BAD_USER_INPUT": 400,
                  "CONFLICT": 409, "NOT_FOUND": 404, "UNAVAILABLE": 503, "TIMEOUT": 504}


def is_public(exc: EngramError) -> bool:
    """Whether a client may read the error's message: Engram's own wording, or a database
    refusal mapped to a code. An unmapped database error's text (it may quote SQL or data)
    belongs in the log only."""
    return exc.code != EngramError.code or exc.sqlstate is None


def internal_message(exc: BaseException, where: Any = None) -> str:
    """Log an unexpected error with a reference; the reference is all a client is told."""
    reference = uuid.uuid4().hex[:12]
    log.error("unexpected error %s in %s", reference, where or "a request", exc_info=exc)
    return f"internal error (reference {reference})"


def error_class_for(sqlstate: str | None) -> type[EngramError]:
    if not sqlstate:
        return EngramError
    for length in (5, 2):
        cls = _SQLSTATE_MAP.get(sqlstate[:length])
        if cls is not None:
            return cls
    return EngramError


def from_sqlstate(sqlstate: str | None, message: str) -> EngramError:
    """Translate a database error into Engram's hierarchy."""
    cls = error_class_for(sqlstate)
    if cls is Unavailable:
        return Unavailable(sqlstate=sqlstate, detail=message)
    return cls(message, sqlstate=sqlstate)


def _driver_error(exc: BaseException) -> BaseException:
    """The driver's exception inside SQLAlchemy's wrapper (or the exception itself)."""
    return getattr(exc, "orig", None) or exc


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is out of reach (not that it refused the request).

    A connection attempt that fails (refused, timed out, the server starting or stopping),
    a connection the server closed, and the SQLSTATE classes 08 and 57P01-57P03: all are
    worth retrying after a pause. Anything else is the request's own problem."""
    if isinstance(exc, Unavailable):
        return True
    if getattr(exc, "connection_invalidated", False):  # SQLAlchemy: the link broke mid-use
        return True
    orig = _driver_error(exc)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is not None:
        return error_class_for(sqlstate) is Unavailable
    import psycopg

    # No SQLSTATE: the server never answered (connect failed) or the socket closed.
    return isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError)


# Refusals that say nothing about the request itself: another transaction was in the way.
RETRY_LATER = frozenset({"40001", "40P01", "55P03"})  # serialization, deadlock, lock busy


def is_retryable(exc: BaseException) -> bool:
    """Whether ``exc`` is worth the same work again later, unchanged: the database out of reach
    (``is_unavailable``) or a concurrent transaction in the way (``RETRY_LATER``). A unique
    violation, a check or a policy refusal is the work's own and fails the same way again."""
    return is_unavailable(exc) or getattr(_driver_error(exc), "sqlstate", None) in RETRY_LATER


def describe_unavailable(exc: BaseException) -> str:
    """A short reason for an unavailable database, safe to show anyone (no host, no port)."""
    orig = _driver_error(exc)
    sqlstate = getattr(orig, "sqlstate", None) or getattr(exc, "sqlstate", None)
    if sqlstate in _UNAVAILABLE_WHY:
        return f"the database is unavailable: {_UNAVAILABLE_WHY[sqlstate]} ({sqlstate})"
    text = (exc.detail if isinstance(exc, Unavailable) and exc.detail else str(orig)).lower()
    if "refused" in text:
        why = "the connection was refused"
    elif "closed" in text or "terminat" in text or "lost" in text:
        why = "the connection was lost"
    elif "timeout" in text or "timed out" in text:
        why = "the connection timed out"
    else:
        why = "the connection failed"
    return f"the database is unavailable: {why}" + (f" ({sqlstate})" if sqlstate else "")


# What a client is told for a refusal PostgreSQL itself worded about a constraint, a policy
# or a lock: its own text names constraints and tables, which belong in the log only. The
# messages of Engram's own functions (PL/pgSQL ``raise``) are written for clients and kept, as
# are PostgreSQL's words for a bad value (class 22, 54: they describe the value, not the schema).
_BUILTIN_WORDING: dict[str, str] = {
    "23505": "duplicate key: a row with the same identity already exists where you can see it",
    "23P01": "the row overlaps one that already exists",
    "23503": "a row this write refers to does not exist or is not visible to you",
    "23502": "a required value is missing",
    "23514": "a value is not allowed",
    "42501": "not permitted: a write needs write access to every scope the row is (or would be) "
             "shared into",
    "40001": "the write conflicted with a concurrent one; retry it",
    "40P01": "the write conflicted with a concurrent one; retry it",
    "55P03": "a row is locked by another write; retry it",
    "57014": "the request was stopped in the database (past its time limit, or cancelled by "
             "an operator); nothing was written",
}


def database_refusal(sqlstate: str | None, message: str, *, own: bool,
                     constraint: str | None = None, table: str | None = None,
                     column: str | None = None) -> EngramError:
    """A database error as Engram's: ``own`` says Engram's SQL worded ``message`` for clients
    (kept as is); otherwise a mapped refusal gets a wording that names no constraint, table or
    SQL (a check names its rule in words, a missing value its column), and anything unmapped
    keeps its text for the log only (``is_public`` is false for it)."""
    cls = error_class_for(sqlstate)
    if own or cls is EngramError or not sqlstate:
        return cls(message, sqlstate=sqlstate)
    wording = _BUILTIN_WORDING.get(sqlstate) or _BUILTIN_WORDING.get(sqlstate[:2])
    if wording is None:
        return cls(message, sqlstate=sqlstate)
    if sqlstate == "23514" and constraint and table and constraint.startswith(f"ck_{table}_"):
        rule = constraint.removeprefix(f"ck_{table}_").replace("_", " ")
        wording = f"a value breaks the rule '{rule}' of {table.replace('_', ' ')}"
    elif sqlstate == "23502" and column:
        wording = f"a required value is missing: {column.replace('_', ' ')}"
    return cls(wording, sqlstate=sqlstate)
