"""DBA tasks: tenants and scopes, run as ``engram_dba`` through ``auth`` functions."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, create_engine, func, pool, select, text
from sqlalchemy.exc import DBAPIError

from orchestrator.db.engine import Database
from orchestrator.db.models import Tenant
from orchestrator.db.session import translate
from orchestrator.errors import BadInput, Conflict, NotFound
from orchestrator.inputs import name_problem

# auth.tenants' and auth.scopes' checks (migration 0001), said in words before the database
# says them in its own: a DBA is told which value is wrong and what it may be.
MAX_TENANT_TEXT = 200
SCOPE_NAME = re.compile(r"[a-z0-9][a-z0-9._:-]{0,62}")
MAX_SCOPE_DESCRIPTION = 2000


def _refuse(*found: str | None) -> None:
    listed = [p for p in found if p]
    if listed:
        raise BadInput("; ".join(listed))


@contextmanager
def _exists(message: str) -> Iterator[None]:
    """A unique violation inside is said as ``message`` (the database's words name no row)."""
    try:
        yield
    except Conflict as exc:
        if exc.sqlstate != "23505":
            raise
        raise Conflict(message, sqlstate=exc.sqlstate) from exc


@contextmanager
def dba_connection(db: Database) -> Iterator[Connection]:
    """One transaction on the admin URL acting as ``engram_dba`` (never a superuser's view)."""
    engine = create_engine(db.admin_url(), poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("set local role engram_dba"))
            yield conn
    except DBAPIError as exc:
        raise translate(exc) from exc
    finally:
        engine.dispose()


def create_tenant(db: Database, org_id: str, name: str) -> uuid.UUID:
    """A tenant for ``org_id`` (the organization claim of its users' tokens)."""
    _refuse(name_problem("organization id", org_id, MAX_TENANT_TEXT),
            None if name == org_id else name_problem("tenant name", name, MAX_TENANT_TEXT))
    with _exists(f"a tenant for organization {org_id!r} already exists"), \
            dba_connection(db) as conn:
        tenant: uuid.UUID = conn.execute(select(func.auth.create_tenant(org_id, name))).scalar_one()
        return tenant


def tenant_id(conn: Connection, org_id: str) -> uuid.UUID:
    found = conn.execute(select(Tenant.id).where(Tenant.org_id == org_id)).scalar()
    if found is None:
        raise NotFound(f"no tenant for organization {org_id!r}")
    return found


def create_scope(db: Database, org_id: str, name: str, description: str = "") -> uuid.UUID:
    """A scope ``name`` in the tenant of ``org_id`` (tokens grant it as ``read:NAME`` or
    ``write:NAME``)."""
    _refuse(None if SCOPE_NAME.fullmatch(name) else (
                f"scope name {name[:80]!r}{'...' if len(name) > 80 else ''} must be 1 to 63 "
                "characters of a-z, 0-9, '.', '_', ':' and '-', beginning with a letter or digit"),
            name_problem("scope description", description, MAX_SCOPE_DESCRIPTION, layout=True))
    with _exists(f"scope {name!r} already exists in organization {org_id!r}"), \
            dba_connection(db) as conn:
        tenant = tenant_id(conn, org_id)
        scope: uuid.UUID = conn.execute(
            select(func.auth.create_scope(tenant, name, description))).scalar_one()
        return scope
