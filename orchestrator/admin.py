"""DBA tasks: tenants and scopes, run as ``engram_dba`` through ``auth`` functions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, create_engine, func, pool, select, text
from sqlalchemy.exc import DBAPIError

from orchestrator.db.engine import Database
from orchestrator.db.models import Tenant
from orchestrator.db.session import translate
from orchestrator.errors import NotFound


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
    with dba_connection(db) as conn:
        tenant: uuid.UUID = conn.execute(select(func.auth.create_tenant(org_id, name))).scalar_one()
        return tenant


def tenant_id(conn: Connection, org_id: str) -> uuid.UUID:
    found = conn.execute(select(Tenant.id).where(Tenant.org_id == org_id)).scalar()
    if found is None:
        raise NotFound(f"no tenant for organization {org_id!r}")
    return found


def create_scope(db: Database, org_id: str, name: str, description: str = "") -> uuid.UUID:
    with dba_connection(db) as conn:
        tenant = tenant_id(conn, org_id)
        scope: uuid.UUID = conn.execute(
            select(func.auth.create_scope(tenant, name, description))
        ).scalar_one()
        return scope
