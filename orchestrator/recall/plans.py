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
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping

from sqlalchemy import BigInteger, cast, func, select
from sqlalchemy.orm import Session

from orchestrator.config import Settings
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


def visible_chunks(session: Session) -> int:
    """Chunks the bound identity may see (the BM25 lane's N), one index probe per scope set."""
    total = session.execute(select(cast(func.coalesce(func.sum(LexicalStat.chunks), 0), BigInteger))
                            .where(LexicalStat.tenant_id == func.auth.tenant_id())).scalar_one()
    return int(total)


class TenantSizes:
    """The last visible chunk count seen per tenant, kept ``ttl_s`` seconds (thread safe)."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._seen: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def get(self, tenant: str) -> int | None:
        with self._lock:
            found = self._seen.get(tenant)
        if found is None or time.monotonic() - found[1] > self.ttl_s:
            return None
        return found[0]

    def put(self, tenant: str, chunks: int) -> None:
        with self._lock:
            self._seen[tenant] = (chunks, time.monotonic())


def transaction_settings(chunks: int, settings: Settings) -> dict[str, str]:
    """What the recall transaction sets for itself: plan reuse, the dense lane's list size and
    how long a statement may run (``recall_statement_timeout_ms``)."""
    out = {"hnsw.ef_search": str(ef_search_for(chunks, settings.recall_ef_search_by_chunks))}
    if settings.recall_plan_reuse:
        out["plan_cache_mode"] = "force_generic_plan"
    if settings.recall_statement_timeout_ms:
        out["statement_timeout"] = str(settings.recall_statement_timeout_ms)
    return out
