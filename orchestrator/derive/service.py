"""The derive service identity: which tenants exist, and acting in one as the service.

Identities normally come from verified tokens. The background jobs act for a
whole tenant instead, so migration ``0011_derive_jobs`` gives them a narrow
path that no token can take:

* ``auth.service_tenants()`` (SECURITY DEFINER, executable by ``engram_worker``
  only) lists every tenant's id, organization id and scope names;
* ``auth.bind_service_identity(org, scopes)`` (``engram_app``) binds the user
  ``service:derive`` with write on those scopes through ``auth.bind_identity``
  and marks the transaction as the service's, which ``auth.is_service()``
  checks. Only a transaction so marked reads every user's working memory (to
  build each user's private episodes and decisions). A token whose subject is
  ``service:derive`` binds through ``auth.bind_identity`` alone and is an
  ordinary user.

Everything a job writes as the service names ``service:derive`` as its author
(claims), ``created_by`` and chain actor.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.db.session import translate

SERVICE_USER = "service:derive"


@dataclass(frozen=True)
class ServiceTenant:
    id: uuid.UUID
    org_id: str
    scopes: tuple[str, ...]


def service_tenants(worker: Connection, only: Sequence[uuid.UUID] | None = None) -> list[ServiceTenant]:
    """Every tenant (or those in ``only``), read on an ``engram_worker`` connection."""
    try:
        rows = worker.execute(text("select tenant_id, org_id, scopes from auth.service_tenants()")).all()
    except DBAPIError as exc:
        raise translate(exc) from exc
    wanted = set(only) if only is not None else None
    return [ServiceTenant(r.tenant_id, r.org_id, tuple(r.scopes)) for r in rows
            if wanted is None or r.tenant_id in wanted]


@contextmanager
def service_session(engine: Engine, tenant: ServiceTenant) -> Iterator[Session]:
    """One transaction on ``engine`` (``engram_app``) as the service, with write on every scope."""
    session = Session(engine, expire_on_commit=False)
    try:
        with session.begin():
            session.execute(select(func.auth.bind_service_identity(tenant.org_id, list(tenant.scopes))))
            yield session
    except DBAPIError as exc:
        raise translate(exc) from exc
    finally:
        session.close()


def job_lock(session: Session, job: str) -> None:
    """Queue behind any other run of ``job`` in this tenant until this transaction ends.

    Two workers (or a worker and ``engram derive``) running the same job at once
    would both see "nothing stored yet" and write twice; the second one waits and
    then finds the first one's rows.
    """
    session.execute(text("select pg_advisory_xact_lock(hashtextextended("
                         "'engram.derive:' || auth.tenant_id()::text || ':' || :job, 0))"), {"job": job})
