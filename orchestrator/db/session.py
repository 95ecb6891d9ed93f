"""Binding a verified identity to one transaction.

``bound_session`` is the only way application code reaches tenant data: it
opens a transaction as ``engram_app``, calls ``auth.bind_identity`` (which sets
per-transaction settings the RLS policies read) and yields a SQLAlchemy
``Session``. The binding ends with the transaction, so a pooled connection never
carries one identity into the next request.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import psycopg
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.auth import Identity
from orchestrator.errors import EngramError, Unavailable, database_refusal, from_sqlstate, is_unavailable

# PL/pgSQL's ``raise``: the message was written by Engram's SQL, for clients.
_RAISED_BY = "exec_stmt_raise"


def translate(exc: DBAPIError) -> EngramError:
    """Map a driver error to Engram's hierarchy (SQLSTATE based; a database out of reach is
    ``Unavailable``, whose message names no host or port); PostgreSQL's own wording of a
    refusal (naming constraints and tables) is replaced by one that names neither."""
    orig = exc.orig
    if is_unavailable(exc):
        return Unavailable(sqlstate=getattr(orig, "sqlstate", None), detail=str(orig).split("\n")[0])
    sqlstate = getattr(orig, "sqlstate", None)
    message = str(orig).split("\n")[0] if orig is not None else str(exc)
    if not isinstance(orig, psycopg.Error):
        return from_sqlstate(sqlstate, message)
    diag = orig.diag
    if diag.message_primary:
        message = diag.message_primary
    return database_refusal(sqlstate, message, own=diag.source_function == _RAISED_BY,
                            constraint=diag.constraint_name, table=diag.table_name,
                            column=diag.column_name)


@contextmanager
def bound_session(engine: Engine, identity: Identity, *,
                  settings: Mapping[str, str] | None = None) -> Iterator[Session]:
    """A session whose one transaction runs under ``identity``; commits on success.

    ``settings`` are set for the transaction only (``set_config(name, value, true)``), in the
    same statement that binds the identity: no extra round trip.
    """
    session = Session(engine, expire_on_commit=False)
    try:
        with session.begin():
            session.execute(select(func.auth.bind_identity(
                identity.org_id, identity.user_id,
                sorted(identity.read_scopes), sorted(identity.write_scopes),
            ), *(func.set_config(name, value, True) for name, value in (settings or {}).items())))
            yield session
    except DBAPIError as exc:
        raise translate(exc) from exc
    finally:
        session.close()


@contextmanager
def prepared_at_once(connection: Connection) -> Iterator[None]:
    """Statements executed inside are prepared by the server at their first execution.

    psycopg prepares a statement text on a connection only at its fifth execution
    (``prepare_threshold``); before that each is planned for its call alone. For the
    recall statement (one text per size class, ninety kilobytes, 15-40 ms to plan) that
    meant four plans per pooled connection before the reused one, and a warm-up that
    could not leave a plan behind."""
    driver = connection.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        yield  # another driver: its own preparation rules
        return
    before = driver.prepare_threshold
    driver.prepare_threshold = 0
    try:
        yield
    finally:
        driver.prepare_threshold = before
