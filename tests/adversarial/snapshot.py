"""A fingerprint of every row of one tenant in every tenant table, as the superuser sees it: two
equal snapshots mean nothing was written (rows, versions, chain events, usage, anything)."""

from __future__ import annotations

import uuid
from functools import lru_cache

from sqlalchemy import Engine, text


@lru_cache(maxsize=1)
def tenant_tables(admin_engine: Engine) -> tuple[str, ...]:
    """Every table with a ``tenant_id`` column, in Engram's schemas."""
    with admin_engine.connect() as conn:
        rows = conn.execute(text(
            "select c.table_schema || '.' || c.table_name from information_schema.columns c "
            "join information_schema.tables t on t.table_schema = c.table_schema "
            " and t.table_name = c.table_name and t.table_type = 'BASE TABLE' "
            "where c.column_name = 'tenant_id' "
            "and c.table_schema in ('sources', 'knowledge', 'memory', 'provenance', 'recall', 'auth') "
            "order by 1")).scalars().all()
    return tuple(rows)


def snapshot(admin_engine: Engine, tenant: uuid.UUID) -> dict[str, str]:
    """table -> md5 of its rows of ``tenant`` (one statement)."""
    tables = tenant_tables(admin_engine)
    parts = [f"select '{t}', md5(coalesce(string_agg(md5(x::text), ',' order by md5(x::text)), '')) "
             f"from {t} x where x.tenant_id = :t" for t in tables]
    with admin_engine.connect() as conn:
        return dict(conn.execute(text(" union all ".join(parts)), {"t": tenant}).all())  # type: ignore[arg-type]


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(t for t in before if before[t] != after.get(t))
