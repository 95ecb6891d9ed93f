"""A database that refuses one row: the poisoned item of the poison tests.

``refused(admin, table, when)`` adds, for the length of a ``with`` block, a BEFORE
INSERT OR UPDATE trigger on ``table`` that raises a check violation (23514) for the
rows matching ``when`` (an SQL condition on ``new``), the way a constraint the job did
not foresee refuses one item. ``runs`` reads a tenant's ``memory.job_runs`` as the
superuser, and ``run_as_service`` runs one registry job the way the worker's schedule
does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from orchestrator.config import Settings
from orchestrator.derive.jobs import JOBS_BY_NAME, JobResult, run_job
from orchestrator.derive.service import ServiceTenant, service_session
from tests.conftest import TenantFixture


@contextmanager
def refused(admin: Engine, table: str, when: str) -> Iterator[None]:
    name = f"tests_poison_{uuid.uuid4().hex[:10]}"
    with admin.begin() as conn:
        conn.execute(text(
            f"create function public.{name}() returns trigger language plpgsql as $$ begin "
            "raise exception 'this row is refused (the test''s poison)' using errcode = '23514'; "
            "end $$"))
        conn.execute(text(f"create trigger {name} before insert or update on {table} for each row "
                          f"when ({when}) execute function public.{name}()"))
    try:
        yield
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"drop trigger {name} on {table}"))
            conn.execute(text(f"drop function public.{name}()"))


def run_as_service(app_engine: Engine, t: TenantFixture, job: str, settings: Settings) -> JobResult:
    tenant = ServiceTenant(t.id, t.org_id, tuple(sorted(t.scopes)))

    def sessions() -> AbstractContextManager[Session]:
        return service_session(app_engine, tenant)

    return run_job(JOBS_BY_NAME[job], sessions, settings, t.org_id)


def runs(admin: Engine, t: TenantFixture) -> list[dict[str, Any]]:
    with admin.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(
            "select job, ok, line, skipped, problems, run_by, scopes from memory.job_runs "
            "where tenant_id = :t order by finished_at"), {"t": t.id})]
