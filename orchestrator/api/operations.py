"""What operators look at: the embedding queue, the models, recall latency, document value and
the derive job runs. Shared by the GraphQL fields of ``graphql/console.graphql``.

Every count here is taken in the request's ``bound_session``, so it counts only rows the caller
may read: a reader of one scope sees the queue of that scope, never the size of another's.
Two figures are not rows and are kept by this process instead: recall latencies (per tenant,
since the process started) and the derive scheduler's job runs (``derive.jobs.RUN_LOG``); the
runs are tenant-wide, so only a token with the ``dba`` role reads them.
"""

from __future__ import annotations

import bisect
import threading
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.models import Document
from orchestrator.errors import BadInput, Forbidden

# The tables whose rows wait for an embedding, as the worker lists them (worker/queue.py);
# named here rather than imported so the API does not import the worker's module.
QUEUE_TABLES = ("sources.chunks", "knowledge.fact_content", "memory.working_memory",
                "memory.profiles", "memory.episodes", "memory.observations",
                "memory.communities", "memory.raptor_nodes", "memory.decisions")
# Bucket bounds of the latency histogram, in milliseconds.
LATENCY_BOUNDS_MS = (25.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0, 6400.0)


@dataclass(frozen=True)
class QueueTable:
    table: str
    pending: int
    failed: int
    ready: int
    last_hour: int
    last_error: str | None


@dataclass(frozen=True)
class QueuePoint:
    at: datetime
    depth: int
    embedded: int


@dataclass(frozen=True)
class EmbedQueue:
    tables: list[QueueTable]
    series: list[QueuePoint]


def embed_queue(session: Session, *, hours: int = 24, buckets: int = 24) -> EmbedQueue:
    """Depth, failures and throughput per table, and the depth at ``buckets`` moments over the
    last ``hours`` (from each row's ``created_at`` and ``embedded_at``), all under RLS."""
    if not 1 <= hours <= 24 * 31:
        raise BadInput("hours must be between 1 and 744")
    if not 2 <= buckets <= 200:
        raise BadInput("buckets must be between 2 and 200")
    tables = []
    for table in QUEUE_TABLES:
        row = session.execute(text(f"""
            select count(*) filter (where embed_state = 'pending') as pending,
                   count(*) filter (where embed_state = 'failed') as failed,
                   count(*) filter (where embed_state = 'ready') as ready,
                   count(*) filter (where embedded_at > now() - interval '1 hour') as last_hour,
                   (select embed_error from {table} f where f.embed_state = 'failed'
                     order by f.created_at desc limit 1) as last_error
              from {table}""")).one()
        tables.append(QueueTable(table, row.pending, row.failed, row.ready, row.last_hour,
                                 row.last_error))
    now = datetime.now(UTC)
    step = timedelta(hours=hours) / (buckets - 1)
    moments = [now - step * (buckets - 1 - i) for i in range(buckets)]
    union = " union all ".join(f"select created_at, embedded_at from {t}" for t in QUEUE_TABLES)
    rows = session.execute(text(f"""
        with rows as ({union}), moments as (select unnest(cast(:m as timestamptz[])) as at)
        select m.at,
               (select count(*) from rows r where r.created_at <= m.at
                   and (r.embedded_at is null or r.embedded_at > m.at)) as depth,
               (select count(*) from rows r where r.embedded_at > m.at - cast(:step as interval)
                   and r.embedded_at <= m.at) as embedded
          from moments m order by m.at"""), {"m": moments, "step": step}).all()
    return EmbedQueue(tables, [QueuePoint(r.at, r.depth, r.embedded) for r in rows])


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    dimension: int
    active: bool
    activated_at: datetime | None


@dataclass(frozen=True)
class ModelStatus:
    embedding_model: str
    registry: list[RegisteredModel]
    reranker: str
    loaded: bool
    reranker_available: bool | None
    reranker_note: str | None
    device: str | None


def model_status(session: Session, settings: Settings, reranker: Any | None,
                 device: Any | None = None) -> ModelStatus:
    """The configured models, the database's registry, and what this process has loaded
    (``reranker`` is the recaller's cross-encoder once a recall has loaded it, else None:
    asking never loads a model; ``device`` the loaded embedder's ``DeviceChoice``)."""
    registry = [RegisteredModel(r.name, r.dimension, r.active, r.activated_at)
                for r in session.execute(text(
                    "select name, dimension, active, activated_at from worker.embedding_models "
                    "order by active desc, name"))]
    return ModelStatus(
        embedding_model=str(settings.embedding_model_path or settings.embedding_model),
        registry=registry,
        reranker=str(settings.reranker_model_path or settings.reranker_model),
        loaded=reranker is not None,
        reranker_available=bool(reranker.available) if reranker is not None else None,
        reranker_note=getattr(reranker, "note", None) if reranker is not None else None,
        device=(f"{device.device} ({device.reason})" if device is not None
                else settings.device or "auto: chosen when the embedding model loads"))


def _words(value: Any) -> str:
    """An activity's parameter as a person reads it: a list's items joined ("days 2026-12-06,
    2026-12-07", not "days ['2026-12-06', '2026-12-07']"), anything else as it prints."""
    if isinstance(value, list):
        return ", ".join(_words(v) for v in value) or "none"
    return str(value)


class LatencyLog:
    """Recall latencies per tenant (organization id), the last ``size`` of each."""

    def __init__(self, size: int = 2000) -> None:
        self._size = size
        self._by_tenant: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def record(self, org_id: str, ms: float) -> None:
        with self._lock:
            self._by_tenant.setdefault(org_id, deque(maxlen=self._size)).append(ms)

    def histogram(self, org_id: str) -> dict[str, Any]:
        with self._lock:
            values = sorted(self._by_tenant.get(org_id, ()))
        counts = [0] * (len(LATENCY_BOUNDS_MS) + 1)
        for v in values:
            counts[bisect.bisect_left(LATENCY_BOUNDS_MS, v)] += 1

        def quantile(q: float) -> float | None:
            return values[min(len(values) - 1, int(q * len(values)))] if values else None

        return {"count": len(values), "p50": quantile(0.5), "p95": quantile(0.95),
                "buckets": [{"le": le, "count": n} for le, n in
                            zip((*LATENCY_BOUNDS_MS, None), counts, strict=True)]}


LATENCIES = LatencyLog()


@dataclass(frozen=True)
class DocumentValue:
    id: uuid.UUID
    title: str
    collection: str
    path: str
    uses: int
    marks: int
    days: int


def document_value(session: Session, *, days: int = 30, first: int = 20) -> list[DocumentValue]:
    """Readable documents by use over ``days`` days (``memory.value_daily``), most used first."""
    from orchestrator.derive.lifecycle import DOCUMENTS, value

    # value() ranks every item kind; take enough to fill the page with documents.
    items = [v for v in value(session, days=days, limit=1000) if v.item_table == DOCUMENTS]
    docs = {d.id: d for d in session.execute(
        select(Document).where(Document.id.in_([v.item_id for v in items]))).scalars()}
    out = [DocumentValue(v.item_id, docs[v.item_id].title, docs[v.item_id].collection,
                         docs[v.item_id].path, v.uses, v.marks, v.days)
           for v in items if v.item_id in docs]
    return out[:first]


@dataclass(frozen=True)
class DeriveRun:
    job: str
    ok: bool
    source: str
    started_at: datetime
    seconds: float | None
    summary: str
    error: str | None


def require_dba(identity: Identity, what: str) -> None:
    if "dba" not in identity.roles:
        raise Forbidden(f"{what} is for DBAs: the token needs the engram:dba scope")


def derive_runs(session: Session, identity: Identity, *, first: int = 50) -> list[DeriveRun]:
    """This process's scheduler runs for the caller's tenant, the runs kept in
    ``memory.job_runs`` (runs of any process that failed or skipped an item, readable by a
    reader of every scope they covered), and the derive activities of the provenance log
    (runs that wrote something, from any process), newest first."""
    from orchestrator.derive.jobs import RUN_LOG

    require_dba(identity, "deriveRuns")
    runs = [DeriveRun(r.job, r.ok, "scheduler", r.started_at, r.seconds,
                      r.line if r.ok else "failed", None if r.ok else r.line)
            for r in RUN_LOG.runs(identity.org_id)]
    for row in session.execute(text("""
            select job, ok, line, skipped, problems, started_at, finished_at from memory.job_runs
             order by finished_at desc limit :n"""), {"n": first}):
        skipped = "; ".join(f"skipped {p.get('item')}: {p.get('reason')}" for p in row.problems or [])
        summary = row.line + (f" ({row.skipped} skipped: {skipped})" if row.skipped else "")
        runs.append(DeriveRun(row.job, row.ok, "job_runs", row.started_at,
                              (row.finished_at - row.started_at).total_seconds(),
                              summary if row.ok else "failed", None if row.ok else summary))
    for row in session.execute(text("""
            select kind, started_at, ended_at, detail from provenance.activities
             where kind like 'derive.%' order by started_at desc limit :n"""), {"n": first}):
        seconds = (row.ended_at - row.started_at).total_seconds() if row.ended_at else None
        detail = ", ".join(f"{k} {_words(v)}" for k, v in sorted(row.detail.items())) or "recorded"
        runs.append(DeriveRun(row.kind.removeprefix("derive."), True, "provenance",
                              row.started_at, seconds, detail, None))
    runs.sort(key=lambda r: r.started_at, reverse=True)
    return runs[:first]
