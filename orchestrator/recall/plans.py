"""Reusing the recall statement's plan: one plan per tenant size class, made once per connection.

Why: the recall statement is some ninety kilobytes of SQL with every lane in it, and
planning it costs about as much as running it for a small tenant (measured on the
3k-chunk benchmark corpus: 12-30 ms of planning for 15-40 ms of execution). A
prepared statement (psycopg prepares a statement the fifth time a connection sends
it) keeps its plan only when the plan is *generic*; 0014 set the app role to
``force_custom_plan`` because one text serves every tenant, and a plan made for a
tenant of ten chunks is the wrong plan for one of ninety thousand: under RLS the
planner still folds ``auth.tenant_id()`` to estimate the tenant's rows, so the first
tenant to plan a generic plan would decide it for everyone.

So the text differs per **size class** of the caller's visible corpus (a decade of
chunks: fewer than 10, 10-99, ..., a million or more), as a comment at its head:
each class is its own prepared statement, whose generic plan is made for a tenant of
that class, and every tenant of the class reuses it. The recall transaction asks for
the generic plan (``plan_cache_mode = force_generic_plan``, for that transaction
only; every other statement keeps the role's custom plans). The class also picks
``hnsw.ef_search``: a tenant holding a large share of a large index needs a longer
candidate list for the dense lane to find what exact search finds
(``recall_ef_search_by_chunks``). The constants of the statement (pool sizes, weights)
are literals in its text (``statement._inline_constants``), so a reused plan knows
them; only the question, its embedding, the mode and the session are parameters.

The visible chunk count comes from ``recall.lexical_stats`` (what the BM25 lane
reads anyway), read under the caller's identity when the cached class of the tenant
is older than ``recall_size_ttl_s``; the count chooses a plan and a setting, and is
never shown to anyone.

**A tenant's own vector indexes.** A tenant holding a large share of a large corpus,
filtered out of the one HNSW graph over every tenant's chunks, finds about 0.94 of the
exact top 40 even at pgvector's longest list (``ef_search`` 1,000). ``engram db
tenant-index ORG`` builds partial HNSW indexes holding that tenant's rows only, one beside
each shared one (``models.tenant_index_name``). The same count read finds whether the
caller's tenant has the chunks' one (valid and ready); if so, the recall's text names the
tenant's id as a literal in every vector lane (the planner can use a partial index only
when the query implies its predicate, and a reused plan has no values for parameters), so
that tenant gets its own prepared statement per class, and its list is the schedule's, at
most ``recall_ef_search_own_index``. The literal is only ever the caller's own tenant
(read under its identity), beside the ``auth.tenant_id()`` filter and RLS that hold as
always: a wrong one would empty the lanes, never widen them.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import BigInteger, Boolean, cast, exists, func, literal, select, text
from sqlalchemy.orm import Session

from orchestrator.config import Settings
from orchestrator.db.models import tenant_index_prefix
from orchestrator.recall.tables import LexicalStat

# Decades of chunks: class 0 below 10 chunks, class 6 from a million on.
MAX_CLASS = 6


def size_class(chunks: int) -> int:
    """The decade of ``chunks`` (0 for fewer than ten), at most ``MAX_CLASS``."""
    if chunks < 10:
        return 0
    return min(MAX_CLASS, int(math.log10(chunks)))


def ef_search_for(chunks: int, table: Mapping[int, int]) -> int:
    """The ``hnsw.ef_search`` of the largest threshold in ``table`` at or below ``chunks``."""
    chosen = 40  # pgvector's default, for a table that names no threshold this low
    for floor, ef in sorted((int(k), int(v)) for k, v in table.items()):
        if floor <= chunks:
            chosen = ef
    return chosen


@dataclass(frozen=True)
class TenantSize:
    """What picks a tenant's plan: its visible chunks and, when it has its own vector indexes
    (``engram db tenant-index``), its id for the vector lanes' literal."""

    chunks: int
    own_index: uuid.UUID | None = None


def tenant_size(session: Session) -> TenantSize:
    """The bound identity's visible chunks and whether its tenant has its own vector index
    that the planner may use (built, valid and ready), in one round trip. The index's name
    is ``models.tenant_index_name``'s rule, in SQL."""
    own = (select(literal(True, Boolean))
           .select_from(text("pg_catalog.pg_index i join pg_catalog.pg_class x "
                             "on x.oid = i.indexrelid"))
           .where(text("x.relnamespace = 'sources'::regnamespace and i.indisvalid "
                       "and i.indisready"),
                  text("x.relname = :prefix || replace(auth.tenant_id()::text, '-', '')")
                  .bindparams(prefix=tenant_index_prefix())))
    chunks, tenant, has_own = session.execute(select(
        cast(func.coalesce(func.sum(LexicalStat.chunks), 0), BigInteger),
        func.auth.tenant_id(), exists(own))
        .where(LexicalStat.tenant_id == func.auth.tenant_id())).one()
    return TenantSize(int(chunks), uuid.UUID(str(tenant)) if has_own and tenant else None)


class TenantSizes:
    """The last ``TenantSize`` seen per tenant, kept ``ttl_s`` seconds (thread safe)."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._seen: dict[str, tuple[TenantSize, float]] = {}
        self._lock = threading.Lock()

    def entry(self, tenant: str) -> TenantSize | None:
        with self._lock:
            found = self._seen.get(tenant)
        if found is None or time.monotonic() - found[1] > self.ttl_s:
            return None
        return found[0]

    def get(self, tenant: str) -> int | None:
        found = self.entry(tenant)
        return None if found is None else found.chunks

    def put(self, tenant: str, chunks: int | TenantSize) -> None:
        size = chunks if isinstance(chunks, TenantSize) else TenantSize(chunks)
        with self._lock:
            self._seen[tenant] = (size, time.monotonic())


def transaction_settings(chunks: int | TenantSize, settings: Settings) -> dict[str, str]:
    """What the recall transaction sets for itself: plan reuse, the dense lane's list size
    (at most ``recall_ef_search_own_index`` over a tenant's own indexes) and how long a
    statement may run (``recall_statement_timeout_ms``)."""
    size = chunks if isinstance(chunks, TenantSize) else TenantSize(chunks)
    ef = ef_search_for(size.chunks, settings.recall_ef_search_by_chunks)
    if size.own_index is not None:  # never a longer list than the shared index would get
        ef = min(ef, settings.recall_ef_search_own_index)
    out = {"hnsw.ef_search": str(ef)}
    if settings.recall_plan_reuse:
        out["plan_cache_mode"] = "force_generic_plan"
    if settings.recall_statement_timeout_ms:
        out["statement_timeout"] = str(settings.recall_statement_timeout_ms)
    return out
