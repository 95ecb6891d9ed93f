"""Fixtures for the provenance tests: the auditor's engine, documents, tampering.

Tampering needs what an attacker with superuser rights would do: bypass the
append-only triggers with ``session_replication_role = replica`` (which also
silences the chain triggers) and edit rows directly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, pool, text

from orchestrator.db.session import bound_session
from orchestrator.ingest.documents import DocumentInput, put_document
from tests.conftest import TenantFixture, TestDatabase


@pytest.fixture(scope="session")
def auditor_engine(test_db: TestDatabase) -> Iterator[Engine]:
    eng = create_engine(test_db.database.role_url("engram_auditor"), poolclass=pool.NullPool)
    yield eng
    eng.dispose()


def doc(path: str, body: str | None = None, scopes: tuple[str, ...] = ("team",)) -> DocumentInput:
    return DocumentInput(collection="notes", path=path, title=f"Title {path}",
                         body=body or f"The body of {path}. " * 20, scopes=scopes)


def put(app_engine: Engine, t: TenantFixture, path: str, body: str | None = None,
        user: str = "alice") -> uuid.UUID:
    with bound_session(app_engine, t.identity(user, write=tuple(t.scopes))) as s:
        return put_document(s, doc(path, body)).document_id


def as_superuser(admin_engine: Engine, sql: str, params: dict[str, Any] | None = None) -> None:
    """Run ``sql`` the way a tampering superuser would: every trigger off."""
    with admin_engine.begin() as conn:
        conn.execute(text("set local session_replication_role = replica"))
        for stmt in (s for s in sql.split(";") if s.strip()):
            conn.execute(text(stmt), params or {})


def event_count(admin_engine: Engine, tenant: uuid.UUID) -> int:
    with admin_engine.connect() as conn:
        return int(conn.execute(text("select count(*) from provenance.events where tenant_id = :t"),
                                {"t": tenant}).scalar_one())
