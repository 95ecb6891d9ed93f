"""Engram's one error hierarchy.

Every error a user can meet derives from ``EngramError``; each carries a stable
``code`` that the CLI prints and the GraphQL layer puts in ``extensions.code``.
SQLSTATEs from PostgreSQL are mapped to these classes in exactly one place,
``from_sqlstate``.
"""

from __future__ import annotations

from typing import ClassVar


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


class ServerError(EngramError):
    """The database server could not be started, stopped or reached."""

    code = "SERVER"


# SQLSTATE (or class prefix) -> error class. Longest match wins.
_SQLSTATE_MAP: dict[str, type[EngramError]] = {
    "42501": Forbidden,  # insufficient_privilege, RLS WITH CHECK violations
    "23505": Conflict,  # unique_violation
    "40001": Conflict,  # serialization_failure
    "40P01": Conflict,  # deadlock_detected
    "23503": BadInput,  # foreign_key_violation
    "23502": BadInput,  # not_null_violation
    "23514": BadInput,  # check_violation
    "22": BadInput,  # data exceptions: bad values, formats, ranges
    "P0002": NotFound,  # no_data_found raised by Engram functions
    "28": Unauthenticated,  # invalid authorization specification
}


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
