"""Fixtures for the knowledge tests: shapes defined as the DBA, row counts seen by the superuser."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, text


def define_shape(admin_engine: Engine, tenant_id: uuid.UUID, predicate: str, **fields: Any) -> None:
    """Define a shape the way a DBA does (engram_dba, which may write shapes of any tenant)."""
    cols = ["tenant_id", "predicate", *fields]
    with admin_engine.begin() as conn:
        conn.execute(text("set local role engram_dba"))
        conn.execute(text(f"insert into knowledge.shapes ({', '.join(cols)}) "
                          f"values ({', '.join(':' + c for c in cols)})"),
                     {"tenant_id": tenant_id, "predicate": predicate, **fields})


def strict_shapes(admin_engine: Engine, tenant_id: uuid.UUID) -> None:
    with admin_engine.begin() as conn:
        conn.execute(text("set local role engram_dba"))
        conn.execute(text("insert into knowledge.tenant_settings (tenant_id, strict_shapes) "
                          "values (:t, true)"), {"t": tenant_id})


def counts(admin_engine: Engine, tenant_id: uuid.UUID) -> dict[str, int]:
    """Rows per knowledge/memory table of one tenant, as the superuser sees them."""
    tables = ("knowledge.entities", "knowledge.fact_content", "knowledge.fact_claim",
              "knowledge.quarantine", "knowledge.conflicts", "memory.decisions",
              "memory.episodes", "memory.working_memory")
    with admin_engine.connect() as conn:
        return {t: int(conn.execute(text(f"select count(*) from {t} where tenant_id = :t"),
                                    {"t": tenant_id}).scalar_one()) for t in tables}
