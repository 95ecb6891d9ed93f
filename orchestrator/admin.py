"""DBA tasks: tenants and scopes, run as ``engram_dba`` (``auth`` functions, and the rows of
``auth.tenants`` and ``auth.scopes``, which its policies show whole; it reads no memory row)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, create_engine, delete, func, pool, select, text, update
from sqlalchemy.exc import DBAPIError

from orchestrator.db.engine import Database
from orchestrator.db.models import Scope, Tenant
from orchestrator.db.session import translate
from orchestrator.errors import BadInput, Conflict, NotFound
from orchestrator.inputs import name_problem

# auth.tenants' and auth.scopes' checks (migration 0001), said in words before the database
# says them in its own: a DBA is told which value is wrong and what it may be.
MAX_TENANT_TEXT = 200
SCOPE_NAME = re.compile(r"[a-z0-9][a-z0-9._:-]{0,62}")
MAX_SCOPE_DESCRIPTION = 2000


@dataclass(frozen=True)
class TenantRow:
    org_id: str
    name: str
    scopes: int
    created_at: datetime


@dataclass(frozen=True)
class ScopeRow:
    name: str
    description: str
    created_at: datetime
    # The tables holding rows shared into the scope (``auth.scope_holders``, names only):
    # empty when ``delete-scope`` would delete it.
    holders: tuple[str, ...] = ()


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


def scope_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a scope's name (``auth.scopes``' check), or ``None``."""
    if SCOPE_NAME.fullmatch(name):
        return None
    return (f"scope name {name[:80]!r}{'...' if len(name) > 80 else ''} must be 1 to 63 "
            "characters of a-z, 0-9, '.', '_', ':' and '-', beginning with a letter or digit")


def _description_problem(description: str) -> str | None:
    return name_problem("scope description", description, MAX_SCOPE_DESCRIPTION, layout=True)


def create_scope(db: Database, org_id: str, name: str, description: str = "") -> uuid.UUID:
    """A scope ``name`` in the tenant of ``org_id`` (tokens grant it as ``read:NAME`` or
    ``write:NAME``)."""
    _refuse(scope_name_problem(name), _description_problem(description))
    with _exists(f"scope {name!r} already exists in organization {org_id!r}"), \
            dba_connection(db) as conn:
        tenant = tenant_id(conn, org_id)
        scope: uuid.UUID = conn.execute(
            select(func.auth.create_scope(tenant, name, description))).scalar_one()
        return scope


def tenants(db: Database) -> list[TenantRow]:
    """Every tenant, by organization id, with how many scopes it has."""
    with dba_connection(db) as conn:
        count = (select(func.count()).where(Scope.tenant_id == Tenant.id)
                 .correlate(Tenant).scalar_subquery())
        rows = conn.execute(select(Tenant.org_id, Tenant.name, count, Tenant.created_at)
                            .order_by(Tenant.org_id)).all()
    return [TenantRow(*row) for row in rows]


def scopes(db: Database, org_id: str) -> list[ScopeRow]:
    """The scopes of the tenant of ``org_id``, by name."""
    with dba_connection(db) as conn:
        tenant = tenant_id(conn, org_id)
        rows = conn.execute(select(Scope.name, Scope.description, Scope.created_at,
                                   func.auth.scope_holders(tenant, Scope.id))
                            .where(Scope.tenant_id == tenant).order_by(Scope.name)).all()
    return [ScopeRow(name, description, created, tuple(holders or ()))
            for name, description, created, holders in rows]


def _scope(conn: Connection, org_id: str, name: str) -> Any:
    """The where-clause of scope ``name`` of ``org_id``'s tenant (``NotFound`` if none)."""
    tenant = tenant_id(conn, org_id)
    found = conn.execute(select(Scope.id).where(Scope.tenant_id == tenant,
                                                Scope.name == name)).scalar()
    if found is None:
        raise NotFound(f"no scope {name!r} in organization {org_id!r}")
    return and_(Scope.tenant_id == tenant, Scope.id == found)


def rename_tenant(db: Database, org_id: str, name: str) -> None:
    """The tenant's display name (its organization id, which tokens carry, stays)."""
    _refuse(name_problem("tenant name", name, MAX_TENANT_TEXT))
    with dba_connection(db) as conn:
        conn.execute(update(Tenant).where(Tenant.id == tenant_id(conn, org_id))
                     .values(name=name))


def rename_scope(db: Database, org_id: str, name: str, new_name: str) -> None:
    """Scope ``name`` is called ``new_name`` from now on: its rows stay in it (they name it by
    id), and tokens grant it as ``read:NEW_NAME`` / ``write:NEW_NAME``; a token naming the old
    name is refused until it is issued again."""
    _refuse(scope_name_problem(new_name))
    with _exists(f"scope {new_name!r} already exists in organization {org_id!r}"), \
            dba_connection(db) as conn:
        conn.execute(update(Scope).where(_scope(conn, org_id, name)).values(name=new_name))


def describe_scope(db: Database, org_id: str, name: str, description: str) -> None:
    """Scope ``name``'s description (what it is for; shown to its users by ``scopes``)."""
    _refuse(_description_problem(description))
    with dba_connection(db) as conn:
        conn.execute(update(Scope).where(_scope(conn, org_id, name)).values(description=description))


def delete_scope(db: Database, org_id: str, name: str) -> None:
    """Delete scope ``name``; refused (``Conflict``, naming the tables) while any row is still
    shared into it: the rows would be readable by no one (migration 0093)."""
    with dba_connection(db) as conn:
        conn.execute(delete(Scope).where(_scope(conn, org_id, name)))
