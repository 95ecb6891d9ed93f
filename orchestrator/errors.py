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
    "23503": BadInput,  # foreign_key_violation, and rows named that are not visible
    "23502": BadInput,  # not_null_violation
    "23514": BadInput,  # check_violation
    "22": BadInput,  # data exceptions: bad values, formats, ranges (22023 from Engram's functions)
    "54": BadInput,  # program_limit_exceeded: a value too large for an index or a tsvector
    "42P16": BadInput,  # invalid_table_definition: a table the provenance chain cannot attach to
    "P0001": BadInput,  # raise_exception: a PL/pgSQL refusal raised without its own code
    "P0002": NotFound,  # no_data_found raised by Engram functions
    "28": Unauthenticated,  # invalid authorization specification
}


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
    return error_class_for(sqlstate)(message, sqlstate=sqlstate)
