"""Engram's search indexes: the ``vchordrq`` sizing rule and ``engram db reindex``.

**Sizing.** A ``vchordrq`` index partitions the vectors into ``lists`` by k-means at build
time and scans ``vchordrq.probes`` of them per query. The partition is only as good as the
rows it was built from: 0003 built it on an empty table (``lists = []``, no partition).
The rule here, used by migration 0070 and by ``engram db reindex``:

* fewer than ``FLAT_BELOW_ROWS`` vectors: no partition (``lists = []``), every query
  scans the quantized vectors of the whole (tenant-filtered) table and reranks: exact
  enough and cheap at that size;
* otherwise ``lists = round(4 * sqrt(rows))`` (VectorChord's guidance is 4 to 8 times the
  square root of the row count) and ``probes`` = 5% of the lists (its guidance: 3-10%),
  at least 1, set for the application and worker roles.

**Rebuilding.** ``plan`` reads the catalog: on both tiers every HNSW and GIN index of
Engram's schemas is rebuilt with ``REINDEX INDEX CONCURRENTLY`` (reads and writes go on);
on the VectorChord tier the ``vchordrq`` index is rebuilt the same way when its lists
already fit the table, and otherwise replaced: a new index with the right lists is built
``CONCURRENTLY`` beside it, the old one dropped concurrently and the new one renamed.
An invalid index (the leftover of a failed concurrent build) is dropped, so running the
command again after a failure finishes the job. ``run`` executes a plan on an autocommit
connection while a second connection reads ``pg_stat_progress_create_index`` for the
progress bar.

**A tenant's own vector indexes** (``engram db tenant-index``, pgvector tier). One HNSW
graph per table holds every tenant's rows; a tenant's vector lanes walk it and keep their
own rows. For a tenant with a large share of a large corpus that filter costs recall: at
300k chunks the 90,000-chunk tenant finds 0.94 of the exact top 40 at pgvector's longest
list. Beside each shared index, a partial one with its definition and ``WHERE tenant_id =
'<id>'`` holds that tenant's rows only (``models.tenant_index_name``); recall finds the
chunks' one (``recall.plans.tenant_size``) and names the tenant in its vector lanes so the
planner can use them. Built ``CONCURRENTLY``, the chunks' last; every row the tenant
writes afterwards goes into both graphs.
"""

from __future__ import annotations

import math
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, text

from orchestrator.db.models import OWN_INDEX_PATTERN, tenant_index_name
from orchestrator.errors import BadInput, NotFound

FLAT_BELOW_ROWS = 50_000
VCHORDRQ_INDEX = "ix_chunks_embedding_vchordrq"
VCHORDRQ_TABLE = "sources.chunks"
ENGRAM_SCHEMAS = ("auth", "sources", "knowledge", "memory", "provenance", "worker", "recall")
# The roles whose queries scan the vchordrq index (probes is a per-session setting).
PROBE_ROLES = ("engram_app", "engram_worker")


def vchordrq_lists(rows: int) -> int:
    """The number of lists for ``rows`` vectors; 0 means no partition (``lists = []``)."""
    if rows < FLAT_BELOW_ROWS:
        return 0
    return round(4 * math.sqrt(rows))


def vchordrq_probes(lists: int) -> int:
    """Lists scanned per query: 5% of ``lists`` (at least 1); 0 when there is no partition."""
    return 0 if lists == 0 else max(1, math.ceil(lists * 0.05))


def vchordrq_options(lists: int) -> str:
    """The index's options (TOML, as vchordrq reads them)."""
    return ("residual_quantization = true\n[build.internal]\n"
            f"lists = [{lists if lists else ''}]\n")


def vchordrq_create(name: str, lists: int, *, concurrently: bool) -> str:
    return (f"create index {'concurrently ' if concurrently else ''}{name} on {VCHORDRQ_TABLE} "
            f"using vchordrq (embedding vector_cosine_ops) with (options = $$\n"
            f"{vchordrq_options(lists)}$$)")


def vchordrq_probe_settings(lists: int) -> list[str]:
    """``alter role`` statements that give the scanning roles ``vchordrq.probes``."""
    value = str(vchordrq_probes(lists)) if lists else ""
    return [f"do $s$ begin execute format('alter role {role} in database %I set vchordrq.probes = %L', "
            f"current_database(), '{value}'); end $s$" for role in PROBE_ROLES]


def lists_in(options: str | None) -> int | None:
    """The ``lists`` an existing vchordrq index was built with (0: none), or None if unknown."""
    if not options:
        return None
    m = re.search(r"lists\s*=\s*\[\s*(\d*)\s*\]", options)
    if m is None:
        return None
    return int(m.group(1)) if m.group(1) else 0


@dataclass
class IndexStep:
    """One index to rebuild and the statements that do it (each outside a transaction)."""

    index: str  # schema-qualified
    method: str
    reason: str
    statements: list[str] = field(default_factory=list)


def index_tier(conn: Connection) -> str:
    tier = conn.execute(text(
        "select value from engram.installation where key = 'index_tier'")).scalar()
    return str(tier or "pgvector")


def plan(conn: Connection) -> list[IndexStep]:
    """What ``engram db reindex`` will do on this database, in order."""
    rows = conn.execute(text(
        "select n.nspname, c.relname, am.amname, pg_get_indexdef(c.oid), i.indisvalid "
        "from pg_index i join pg_class c on c.oid = i.indexrelid "
        "join pg_namespace n on n.oid = c.relnamespace join pg_am am on am.oid = c.relam "
        "where am.amname in ('hnsw', 'gin', 'vchordrq') and n.nspname = any(:schemas) "
        "order by n.nspname, c.relname"), {"schemas": list(ENGRAM_SCHEMAS)}).all()
    steps: list[IndexStep] = []
    for schema, name, method, definition, valid in rows:
        qualified = f"{schema}.{name}"
        if not valid:
            # What a failed concurrent build leaves behind (PostgreSQL's advice: drop it).
            steps.append(IndexStep(qualified, method, "invalid (a failed concurrent build): drop",
                                   [f"drop index concurrently if exists {qualified}"]))
            continue
        if method != "vchordrq":
            steps.append(IndexStep(qualified, method, "rebuild in place",
                                   [f"reindex index concurrently {qualified}"]))
            continue
        vectors = int(conn.execute(text(
            f"select count(*) from {VCHORDRQ_TABLE} where embedding is not null")).scalar_one())
        steps.append(vchordrq_step(schema, name, definition, vectors))
    return steps


def vchordrq_step(schema: str, name: str, definition: str, vectors: int) -> IndexStep:
    """Rebuild the vchordrq index ``schema.name`` (built as ``definition``) for ``vectors``
    rows: in place when its lists fit, else replaced by one built with the right lists."""
    qualified = f"{schema}.{name}"
    want = vchordrq_lists(vectors)
    have = lists_in(definition)
    probes = vchordrq_probe_settings(want)
    if have == want:
        return IndexStep(qualified, "vchordrq", f"{vectors} vectors, lists [{want or ''}] fit",
                         [f"reindex index concurrently {qualified}", *probes])
    fresh = f"{name}_new"
    return IndexStep(
        qualified, "vchordrq", f"{vectors} vectors: lists [{have or ''}] -> [{want or ''}]",
        [f"drop index concurrently if exists {schema}.{fresh}",
         vchordrq_create(fresh, want, concurrently=True),
         f"drop index concurrently {qualified}",
         f"alter index {schema}.{fresh} rename to {name}", *probes])


# Where a tenant's own indexes start to pay (docs/recall.md: at 100k chunks the shared index
# finds 0.95-0.99 of a 30,000-chunk tenant's exact top 40; at 300k, 0.94 of a 90,000 one's).
TENANT_INDEX_WORTH_CHUNKS = 50_000
TENANT_INDEX_WORTH_SHARE = 0.10


def worth_own_indexes(chunks: int, total: int) -> bool:
    """Whether a tenant of ``chunks`` in a corpus of ``total`` is large enough, and a large
    enough share of the shared indexes, for its own to pay (docs/database.md)."""
    return chunks >= TENANT_INDEX_WORTH_CHUNKS and chunks >= TENANT_INDEX_WORTH_SHARE * total


@dataclass(frozen=True)
class LiveIndex:
    """A shared vector index a recall lane searches: every tenant's rows of one table."""

    schema: str
    table: str
    name: str
    definition: str


def live_vector_indexes(conn: Connection) -> list[LiveIndex]:
    """The shared HNSW indexes over ``embedding`` in Engram's schemas (the chunks' last:
    recall switches a tenant to its own indexes when the chunks' one appears)."""
    rows = conn.execute(text(
        "select n.nspname, t.relname, c.relname, pg_get_indexdef(c.oid) from pg_index i "
        "join pg_class c on c.oid = i.indexrelid join pg_class t on t.oid = i.indrelid "
        "join pg_namespace n on n.oid = c.relnamespace join pg_am am on am.oid = c.relam "
        "join pg_attribute a on a.attrelid = i.indrelid and a.attnum = i.indkey[0] "
        "where am.amname = 'hnsw' and i.indnatts = 1 and a.attname = 'embedding' "
        "and i.indpred is null and n.nspname = any(:schemas) "
        "order by t.relname = 'chunks', n.nspname, t.relname"),
        {"schemas": list(ENGRAM_SCHEMAS)}).all()
    return [LiveIndex(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]


@dataclass(frozen=True)
class OwnIndex:
    name: str  # schema-qualified
    valid: bool
    size_bytes: int


@dataclass(frozen=True)
class TenantIndex:
    """A tenant, its embedded chunks and its own vector indexes (by qualified name)."""

    org: str
    tenant_id: uuid.UUID
    chunks: int
    own: dict[str, OwnIndex]


def tenant_indexes(conn: Connection, org: str | None = None) -> list[TenantIndex]:
    """Every tenant (or only ``org``), largest first: embedded chunks and its own vector
    indexes (as the migrating role: the counts read the tenants' rows)."""
    rows = conn.execute(text(
        "select t.org_id, t.id, n.chunks from auth.tenants t "
        "cross join lateral (select count(*) as chunks from sources.chunks c "
        "                    where c.tenant_id = t.id and c.embedding is not null) n "
        "where cast(:org as text) is null or t.org_id = :org "
        "order by 3 desc, 1"), {"org": org}).all()
    own: dict[str, dict[str, OwnIndex]] = {}
    for schema, name, valid, size in conn.execute(text(
            "select n.nspname, c.relname, i.indisvalid and i.indisready, pg_relation_size(c.oid) "
            "from pg_index i join pg_class c on c.oid = i.indexrelid "
            "join pg_namespace n on n.oid = c.relnamespace "
            "where c.relname ~ :pattern and n.nspname = any(:schemas)"),
            {"schemas": list(ENGRAM_SCHEMAS), "pattern": OWN_INDEX_PATTERN}):
        own.setdefault(str(name)[-32:], {})[f"{schema}.{name}"] = OwnIndex(
            f"{schema}.{name}", bool(valid), int(size))
    return [TenantIndex(str(org), uuid.UUID(str(tid)), int(chunks),
                        own.get(uuid.UUID(str(tid)).hex, {}))
            for org, tid, chunks in rows]


def tenant_index_steps(conn: Connection, org: str, *, drop: bool = False) -> list[IndexStep]:
    """What ``engram db tenant-index ORG`` does: build ``org``'s own vector index beside each
    shared one (its definition, partial on the tenant; the chunks' last), or drop them
    (``drop``; the chunks' first). One that exists and is valid is left alone; an invalid
    one, left by a failed concurrent build, is dropped and built again. Empty: nothing to
    do."""
    found = next(iter(tenant_indexes(conn, org)), None)
    if found is None:
        raise NotFound(f"no tenant '{org}' (`engram db tenant-index` with no name lists them)")
    if drop:
        chunks = f"sources.{tenant_index_name(found.tenant_id)}"
        names = sorted(found.own, key=lambda n: (n != chunks, n))
        return [IndexStep(n, "hnsw", f"drop the own vector index of tenant '{org}'",
                          [f"drop index concurrently if exists {n}"]) for n in names]
    tier = index_tier(conn)
    if tier != "pgvector":
        raise BadInput(f"the index tier is {tier}: its vchordrq index prefilters by tenant "
                       "(vchordrq.prefilter), so a tenant's own vector index is for the pgvector "
                       "tier only (docs/database.md)")
    live = live_vector_indexes(conn)
    if not any(x.table == "chunks" and x.schema == "sources" for x in live):
        raise NotFound("the chunks' shared vector index is missing: run `engram db migrate` "
                       "(or `engram db reindex`) first")
    steps: list[IndexStep] = []
    for x in live:
        short = tenant_index_name(found.tenant_id, x.table)
        name = f"{x.schema}.{short}"
        have = found.own.get(name)
        if have is not None and have.valid:
            continue
        create = (re.sub(r"^CREATE INDEX \S+ ON ", f"CREATE INDEX CONCURRENTLY {short} ON ",
                         x.definition)
                  + f" WHERE (tenant_id = '{found.tenant_id}'::uuid)")
        reason = f"build for tenant '{org}' beside {x.schema}.{x.name}"
        if x.table == "chunks":
            reason += f" ({found.chunks:,} embedded chunks)"
            if found.chunks < TENANT_INDEX_WORTH_CHUNKS:
                reason += (f"; below about {TENANT_INDEX_WORTH_CHUNKS:,} chunks the shared "
                           "indexes serve a tenant about as well (docs/database.md), and every "
                           "row it writes will go into both")
        statements = [create]
        if have is not None:
            statements.insert(0, f"drop index concurrently if exists {name}")
            reason += "; the invalid one a failed build left is dropped first"
        steps.append(IndexStep(name, "hnsw", reason, statements))
    return steps


Progress = Callable[[str, int, int, str], None]


def run(engine: Engine, steps: list[IndexStep], on_progress: Progress | None = None,
        poll_s: float = 0.5) -> list[tuple[str, float]]:
    """Execute ``steps`` (autocommit, as the migrating role); returns seconds per index.

    ``on_progress(index, done, total, phase)`` is called from a watcher thread with
    ``pg_stat_progress_create_index``'s blocks (or tuples) done and total.
    """
    timings: list[tuple[str, float]] = []
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        pid = int(conn.execute(text("select pg_backend_pid()")).scalar_one())
        for step in steps:
            started = time.monotonic()
            stop = threading.Event()
            watcher = None
            if on_progress is not None:
                watcher = threading.Thread(target=_watch, args=(engine, pid, step.index, on_progress,
                                                                stop, poll_s), daemon=True)
                watcher.start()
            try:
                for statement in step.statements:
                    conn.exec_driver_sql(statement)
            finally:
                stop.set()
                if watcher is not None:
                    watcher.join(timeout=5)
            timings.append((step.index, time.monotonic() - started))
            if on_progress is not None:
                on_progress(step.index, 1, 1, "done")
    return timings


def _watch(engine: Engine, pid: int, index: str, on_progress: Progress, stop: threading.Event,
           poll_s: float) -> None:
    with engine.connect() as conn:
        while not stop.wait(poll_s):
            row = conn.execute(text(
                "select phase, blocks_done, blocks_total, tuples_done, tuples_total "
                "from pg_stat_progress_create_index where pid = :pid"), {"pid": pid}).first()
            conn.rollback()
            if row is None:
                continue
            phase, bdone, btotal, tdone, ttotal = row
            if btotal:
                on_progress(index, int(bdone), int(btotal), str(phase))
            elif ttotal:
                on_progress(index, int(tdone), int(ttotal), str(phase))
            else:
                on_progress(index, 0, 0, str(phase))
