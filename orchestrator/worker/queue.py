"""The embedding queue: rows are the queue.

Every embeddable table carries ``embedding`` and ``embed_state`` (pending,
ready, failed) with ``embed_attempts``, ``embed_error``, ``embed_model`` and
``embedded_at``. ``EMBEDDABLE`` lists those tables; a new one joins with one
line here and one ``worker.make_embeddable(...)`` call in its migration.

One batch is one transaction, as ``engram_worker``:

1. claim up to N pending rows with ``FOR UPDATE SKIP LOCKED`` (rows whose last
   failure is still backing off are skipped), so parallel workers never take
   the same row; N is shared among the tenants with pending rows, and a tenant's
   chunks are taken by their place in their document first (``_claim``, 0084), so
   neither one tenant's bulk write nor one large document holds the rest back;
2. take a transaction-scoped advisory lock per (tenant, content hash) not yet
   cached; a hash another worker is embedding right now is left for later, so
   two workers never compute the same text at once;
3. look the hashes up in ``worker.embedding_cache`` (after locking, so a vector
   committed a moment ago is seen): a hash embedded once under the active model
   is never embedded again;
4. embed the remaining distinct texts; if the batch call fails, each text is
   tried alone so that one poisoned row cannot hold the others back;
5. write vectors to the cache and the rows, count failures, schedule retries
   with exponential backoff, mark a row ``failed`` after the configured number
   of tries; commit.

Because the claim, the model call and the write-back share one transaction, a
worker killed at any point (SIGKILL included) leaves its rows pending and
unlocked: nothing is lost and nothing is written twice.

Workers wait on ``LISTEN engram_embed`` (the tables' NOTIFY triggers) and poll
as a fallback, so a missed notification only delays work by the poll interval.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from orchestrator.config import Settings
from orchestrator.errors import is_unavailable
from orchestrator.health import Backoff, Component, supervise
from orchestrator.worker.registry import ModelMismatch, RegisteredModel, read_active

log = logging.getLogger("engram.worker.queue")

NOTIFY_CHANNEL = "engram_embed"


@dataclass(frozen=True)
class EmbeddableTable:
    """A table whose rows wait for an embedding of one text column."""

    name: str  # schema-qualified, e.g. "sources.chunks"
    text_column: str = "text"
    # Column holding sha256 of the text; None: computed in the claim from the text.
    hash_column: str | None = "content_hash"
    key_columns: tuple[str, ...] = ("id",)  # the primary key after tenant_id
    # A tenant's rows are taken in this order: its queue index (0084) after tenant_id.
    order_columns: tuple[str, ...] = ("created_at",)


# One line per embeddable table (see worker.make_embeddable in 0007_embedding_models).
EMBEDDABLE: tuple[EmbeddableTable, ...] = (
    EmbeddableTable("sources.chunks", order_columns=("ordinal", "created_at")),
    EmbeddableTable("knowledge.fact_content"),
    EmbeddableTable("memory.working_memory", hash_column=None),
    EmbeddableTable("memory.profiles", text_column="summary", hash_column=None),
    EmbeddableTable("memory.episodes", text_column="summary", hash_column=None),
    EmbeddableTable("memory.observations", hash_column=None),
    EmbeddableTable("memory.communities", text_column="summary", hash_column=None),
    EmbeddableTable("memory.raptor_nodes", text_column="summary", hash_column=None),
    EmbeddableTable("memory.decisions", text_column="embed_text", hash_column=None),
)


class PassageEmbedder(Protocol):
    model_name: str
    dimension: int

    def embed_passages(self, texts: Sequence[str]) -> Any: ...


@dataclass
class BatchReport:
    table: str = ""
    claimed: int = 0
    embedded_rows: int = 0
    cache_hits: int = 0
    model_texts: int = 0
    deferred: int = 0
    retried: int = 0
    failed: int = 0


@dataclass
class DrainReport:
    batches: int = 0
    rows: int = 0
    cache_hits: int = 0
    model_texts: int = 0
    retried: int = 0
    failed: int = 0
    seconds: float = 0.0
    per_table: dict[str, int] = field(default_factory=dict)

    def add(self, table: str, b: BatchReport) -> None:
        self.batches += 1
        self.rows += b.embedded_rows
        self.cache_hits += b.cache_hits
        self.model_texts += b.model_texts
        self.retried += b.retried
        self.failed += b.failed
        self.per_table[table] = self.per_table.get(table, 0) + b.embedded_rows

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def quote_ident(ident: str) -> str:
    """``schema.table`` (or a bare name) quoted for SQL text."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in ident.split("."))


_q = quote_ident


def vector_literal(v: Any) -> str:
    return "[" + ",".join(repr(float(x)) for x in v) + "]"


def hash_expr(table: EmbeddableTable, alias: str = "t") -> str:
    """The SQL of a row's content hash: its hash column, or sha256 of its text."""
    return (f"{alias}.{_q(table.hash_column)}" if table.hash_column
            else f"sha256(convert_to({alias}.{_q(table.text_column)}, 'UTF8'))")


def embed_isolated(embedder: PassageEmbedder, texts: list[str]) -> list[Any | str]:
    """A vector per text, or the error text for a text the model failed on: a failing batch
    is tried text by text, so one poisoned text never holds the others back."""
    dim = embedder.dimension

    def check(v: Any) -> Any | str:
        arr = np.asarray(v, dtype=np.float32)
        if arr.shape != (dim,):
            return f"the model returned a vector of shape {arr.shape}, expected ({dim},)"
        if not np.all(np.isfinite(arr)):
            return "the model returned a vector with NaN or infinite values"
        return arr

    try:
        vectors = embedder.embed_passages(texts)
        return [check(v) for v in vectors]
    except Exception as exc:
        if len(texts) == 1:
            return [f"{type(exc).__name__}: {exc}"[:2000]]
        log.warning("a batch of %d texts failed (%s); trying each alone", len(texts), exc)
    out: list[Any | str] = []
    for t in texts:
        out.extend(embed_isolated(embedder, [t]))
    return out


def active_model(conn: Connection) -> tuple[str, int]:
    model = read_active(conn)
    return model.name, model.dimension


def fair_cut(rows: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` of ``rows``, taken a row per tenant in turn (each tenant's rows in
    the order claimed): the shares are rounded up, so the claims can come back a few rows
    over the batch size. The rows left out stay pending (their locks end with the batch's
    transaction) and are claimed again by a later batch."""
    if len(rows) <= limit:
        return rows
    by_tenant: dict[Any, list[Any]] = {}
    for row in rows:
        by_tenant.setdefault(row.tenant_id, []).append(row)
    turns = itertools.zip_longest(*by_tenant.values())
    return [row for turn in turns for row in turn if row is not None][:limit]


class QueueWorker:
    """Drains the embedding queue of the ``EMBEDDABLE`` tables with one embedder.

    ``loader``: how to load a registered model. With one, a worker follows ``engram models
    activate``: it finishes nothing under the old model (the flip waits for batches in
    flight) and carries on with the new one; without one it stops with ``ModelMismatch``."""

    def __init__(self, engine: Engine, embedder: PassageEmbedder, settings: Settings, *,
                 tables: Sequence[EmbeddableTable] = EMBEDDABLE,
                 tenants: Iterable[uuid.UUID] | None = None,
                 loader: Callable[[RegisteredModel], PassageEmbedder] | None = None) -> None:
        self.engine = engine
        self.embedder = embedder
        self.loader = loader
        self.settings = settings
        self.tables = tuple(tables)
        self.tenants = sorted(tenants) if tenants is not None else None
        self.batch_rows = settings.worker_batch_rows
        self.max_attempts = settings.worker_max_attempts
        self.backoff_s = settings.worker_backoff_s
        self._model: str | None = None
        self._turn = 0  # which waiting tenant the next batch starts with
        self.table_errors: dict[str, str] = {}

    # -- model --------------------------------------------------------------

    def check_model(self) -> str:
        """The active model's name; refuses a worker whose model is not it."""
        with self.engine.connect() as conn:
            name, dimension = active_model(conn)
        if name != self.embedder.model_name or dimension != self.embedder.dimension:
            raise ModelMismatch(
                f"the active embedding model is {name} ({dimension}-d) but this worker loaded "
                f"{self.embedder.model_name} ({self.embedder.dimension}-d); set "
                "ENGRAM_EMBEDDING_MODEL to the active model, or re-embed and flip the registry"
            )
        self._model = name
        return name

    def follow_model(self) -> str:
        """Load the active model with ``loader`` (when this worker runs another one)."""
        try:
            return self.check_model()
        except ModelMismatch:
            if self.loader is None:
                raise
        with self.engine.connect() as conn:
            active = read_active(conn)
        log.warning("the active embedding model is now %s; loading it", active.describe())
        self.embedder = self.loader(active)
        return self.check_model()

    # -- SQL ----------------------------------------------------------------

    def _tenant_filter(self) -> str:
        return " and t.tenant_id = any(cast(:tenants as uuid[]))" if self.tenants else ""

    def _waiting_sql(self, table: EmbeddableTable) -> str:
        """The tenants with pending rows, in id order: one probe of the queue index per
        tenant (a loose index scan), however many rows each has waiting."""
        pending = f"t.embed_state = 'pending'{self._tenant_filter()}"
        return (
            "with recursive w(tenant_id) as ("
            f"(select t.tenant_id from {_q(table.name)} t where {pending} "
            "order by t.tenant_id limit 1) "
            f"union all select (select t.tenant_id from {_q(table.name)} t where {pending} "
            "and t.tenant_id > w.tenant_id order by t.tenant_id limit 1) "
            "from w where w.tenant_id is not null) "
            "select tenant_id from w where tenant_id is not null")

    def _claim_sql(self, table: EmbeddableTable, *, more: bool = False) -> str:
        """Up to ``:n`` rows of each tenant in ``:ts``, each tenant's in its queue order;
        with ``more``, none of ``:claimed`` (``tenant_id:row_key``): rows this transaction
        holds already, which its own locks do not make SKIP LOCKED skip."""
        keys = ", ".join(f"t.{_q(k)} as k{i}" for i, k in enumerate(table.key_columns))
        key_text = " || ',' || ".join(f"t.{_q(k)}::text" for k in table.key_columns)
        order = ", ".join(f"t.{_q(c)}" for c in table.order_columns)
        again = (f"and t.tenant_id::text || ':' || {key_text} <> all(cast(:claimed as text[])) "
                 if more else "")
        return (
            "select x.* from unnest(cast(:ts as uuid[])) as w(tenant_id) cross join lateral ("
            f"select t.tenant_id, {keys}, {key_text} as row_key, t.{_q(table.text_column)} as body, "
            f"{hash_expr(table)} as hash, t.embed_attempts as attempts "
            f"from {_q(table.name)} t "
            "where t.tenant_id = w.tenant_id and t.embed_state = 'pending' " + again +
            "and not exists (select 1 from worker.embed_retries r where r.tenant_id = t.tenant_id "
            f"and r.relation = :rel and r.row_key = {key_text} and r.retry_at > now()) "
            # NO KEY UPDATE: the worker changes embedding columns only, so it must not
            # wait for (or skip) rows the extractor holds FOR KEY SHARE while reading them.
            f"order by {order} limit :n for no key update of t skip locked) x"
        )

    def _claim(self, conn: Connection, table: EmbeddableTable) -> list[Any]:
        """A batch shared among the tenants with pending rows: each gets an equal part of
        ``batch_rows`` (at least one row; with more tenants than rows, the batches take
        turns through them), so one tenant's bulk write, or one large document, no longer
        holds every row written after it (0084). The parts a tenant cannot fill go to the
        tenants that filled theirs, so a mixed backlog still makes full batches."""
        waiting = [r[0] for r in conn.execute(text(self._waiting_sql(table)),
                                              {"tenants": self.tenants})]
        if not waiting:
            return []
        start = self._turn % len(waiting)
        self._turn += 1
        chosen = (waiting[start:] + waiting[:start])[:self.batch_rows]
        share = -(-self.batch_rows // len(chosen))
        rows = list(conn.execute(text(self._claim_sql(table)), {
            "rel": table.name, "ts": chosen, "n": share}).all())
        per_tenant = Counter(r.tenant_id for r in rows)
        full = [t for t in chosen if per_tenant[t] == share]
        left = self.batch_rows - len(rows)
        if left > 0 and full:
            rows += conn.execute(text(self._claim_sql(table, more=True)), {
                "rel": table.name, "ts": full, "n": -(-left // len(full)),
                "claimed": [f"{r.tenant_id}:{r.row_key}" for r in rows]}).all()
        return fair_cut(rows, self.batch_rows)

    def _where_key(self, table: EmbeddableTable) -> str:
        return "tenant_id = :tenant_id and " + " and ".join(
            f"{_q(k)} = :k{i}" for i, k in enumerate(table.key_columns))

    def pending(self) -> int:
        """Rows still waiting (any table), including those backing off."""
        total = 0
        with self.engine.connect() as conn:
            for table in self.tables:
                total += int(conn.execute(text(
                    f"select count(*) from {_q(table.name)} t where t.embed_state = 'pending'"
                    + self._tenant_filter()), {"tenants": self.tenants}).scalar_one())
        return total

    def _next_retry_in(self) -> float | None:
        with self.engine.connect() as conn:
            wait = conn.execute(text(
                "select extract(epoch from min(retry_at) - now()) from worker.embed_retries"
                + (" where tenant_id = any(cast(:tenants as uuid[]))" if self.tenants else "")),
                {"tenants": self.tenants}).scalar()
        return None if wait is None else max(0.0, float(wait))

    # -- one batch ----------------------------------------------------------

    def process_batch(self, table: EmbeddableTable) -> BatchReport:
        model = self._model or self.check_model()
        report = BatchReport(table=table.name)
        nkeys = len(table.key_columns)
        with self.engine.begin() as conn:
            # FOR SHARE: a model flip (FOR UPDATE) waits for batches in flight, and
            # no batch starts under a model that is no longer active.
            now_active = conn.execute(text(
                "select name from worker.embedding_models where active for share")).scalar()
            if now_active != model:
                self._model = None
                raise ModelMismatch(f"the active embedding model changed to {now_active}; "
                                    f"this worker embeds with {model} and stops")
            rows = self._claim(conn, table)
            report.claimed = len(rows)
            if not rows:
                return report
            pairs = sorted({(r.tenant_id, bytes(r.hash)) for r in rows})
            locked = conn.execute(text(
                "select u.t as tenant, u.h as hash, pg_try_advisory_xact_lock(hashtextextended("
                "u.t::text || encode(u.h, 'hex') || :m, 7)) as got "
                "from unnest(cast(:ts as uuid[]), cast(:hs as bytea[])) as u(t, h)"),
                {"ts": [p[0] for p in pairs], "hs": [p[1] for p in pairs], "m": model}).all()
            mine = {(r.tenant, bytes(r.hash)) for r in locked if r.got}
            cached: dict[tuple[Any, bytes], str] = {}
            if mine:
                found = conn.execute(text(
                    "select c.tenant_id, c.content_hash, c.embedding::text as v "
                    "from worker.embedding_cache c join unnest(cast(:ts as uuid[]), "
                    "cast(:hs as bytea[])) as u(t, h) on c.tenant_id = u.t and c.content_hash = u.h "
                    "where c.model = :m"),
                    {"ts": [p[0] for p in mine], "hs": [p[1] for p in mine], "m": model}).all()
                cached = {(r.tenant_id, bytes(r.content_hash)): str(r.v) for r in found}
            todo: dict[tuple[Any, bytes], str] = {}
            for r in rows:
                key = (r.tenant_id, bytes(r.hash))
                if key in mine and key not in cached:
                    todo.setdefault(key, r.body)
            computed: dict[tuple[Any, bytes], Any | str] = {}
            if todo:
                keys = list(todo)
                results = embed_isolated(self.embedder, [todo[k] for k in keys])
                report.model_texts = len(keys)
                computed = dict(zip(keys, results, strict=True))
                fresh = [{"t": k[0], "h": k[1], "m": model, "v": vector_literal(v)}
                         for k, v in computed.items() if not isinstance(v, str)]
                if fresh:
                    conn.execute(text(
                        "insert into worker.embedding_cache (tenant_id, model, content_hash, embedding) "
                        "values (:t, :m, :h, cast(:v as vector)) on conflict do nothing"), fresh)
            ready: list[dict[str, Any]] = []
            failures: list[tuple[Any, str]] = []
            for r in sorted(rows, key=lambda r: (r.tenant_id, r.row_key)):
                key = (r.tenant_id, bytes(r.hash))
                if key not in mine:
                    report.deferred += 1
                    continue
                params = {"tenant_id": r.tenant_id, "m": model}
                params.update({f"k{i}": getattr(r, f"k{i}") for i in range(nkeys)})
                if key in cached:
                    report.cache_hits += 1
                    ready.append({**params, "v": cached[key]})
                elif isinstance(computed[key], str):
                    failures.append((r, str(computed[key])))
                else:
                    ready.append({**params, "v": vector_literal(computed[key])})
            where = self._where_key(table)
            if ready:
                conn.execute(text(
                    f"update {_q(table.name)} set embedding = cast(:v as vector), "
                    "embed_state = 'ready', embed_model = :m, embedded_at = clock_timestamp(), "
                    f"embed_error = null, embed_attempts = embed_attempts + 1 where {where}"), ready)
                report.embedded_rows = len(ready)
            retried_keys = [(r.tenant_id, r.row_key) for r in rows
                            if r.attempts > 0 and (r.tenant_id, bytes(r.hash)) in mine]
            if retried_keys:
                conn.execute(text(
                    "delete from worker.embed_retries where relation = :rel and "
                    "(tenant_id, row_key) in (select * from unnest(cast(:ts as uuid[]), "
                    "cast(:ks as text[])))"),
                    {"rel": table.name, "ts": [k[0] for k in retried_keys],
                     "ks": [k[1] for k in retried_keys]})
            for r, error in failures:
                attempts = int(r.attempts) + 1
                params = {"tenant_id": r.tenant_id, "err": error, "a": attempts}
                params.update({f"k{i}": getattr(r, f"k{i}") for i in range(nkeys)})
                final = attempts >= self.max_attempts
                conn.execute(text(
                    f"update {_q(table.name)} set embed_attempts = :a, embed_error = :err"
                    + (", embed_state = 'failed'" if final else "") + f" where {where}"), params)
                if final:
                    report.failed += 1
                    log.error("%s row %s failed %d times; marked failed: %s",
                              table.name, r.row_key, attempts, error)
                    continue
                report.retried += 1
                delay = self.backoff_s * (2 ** (attempts - 1))
                conn.execute(text(
                    "insert into worker.embed_retries (tenant_id, relation, row_key, retry_at, "
                    "last_error) values (:t, :rel, :k, now() + make_interval(secs => :d), :err) "
                    "on conflict (tenant_id, relation, row_key) do update set "
                    "retry_at = excluded.retry_at, last_error = excluded.last_error"),
                    {"t": r.tenant_id, "rel": table.name, "k": r.row_key, "d": delay,
                     "err": error})
        return report

    # -- draining and waiting -------------------------------------------------

    def drain(self, *, wait_for_retries: bool = True,
              on_batch: Callable[[BatchReport], None] | None = None,
              stop: threading.Event | None = None) -> DrainReport:
        """Embed until nothing is claimable (and, if asked, no retry is still due)."""
        started = time.monotonic()
        report = DrainReport()
        self.follow_model()
        while not (stop and stop.is_set()):
            progressed = False
            for table in self.tables:
                try:
                    b = self.process_batch(table)
                except ModelMismatch:
                    if self.loader is None:
                        raise
                    self.follow_model()
                    progressed = True
                    break
                except DBAPIError as exc:
                    if is_unavailable(exc):
                        raise  # the database is gone, not this table: run_forever reconnects
                    # One table's trouble (a trigger the worker may not run, a table a
                    # later revision has not created yet) must not stop the others.
                    self.table_errors[table.name] = str(exc.orig or exc).split("\n")[0]
                    log.error("embedding %s failed: %s", table.name, self.table_errors[table.name])
                    continue
                if b.claimed:
                    report.add(table.name, b)
                    if on_batch is not None:
                        on_batch(b)
                    progressed = progressed or bool(b.embedded_rows or b.retried or b.failed)
                    if b.deferred and not (b.embedded_rows or b.retried or b.failed):
                        time.sleep(0.05)  # another worker holds those hashes; let it commit
                        progressed = True
            if progressed:
                continue
            wait = self._next_retry_in() if wait_for_retries else None
            if wait is None:
                break
            time.sleep(min(wait + 0.01, self.settings.worker_poll_s))
        report.seconds = time.monotonic() - started
        return report

    def run_forever(self, listen_dsn: str, stop: threading.Event,
                    on_batch: Callable[[BatchReport], None] | None = None, *,
                    component: Component | None = None,
                    on_notify: Mapping[str, Callable[[str], None]] | None = None) -> None:
        """Drain, then sleep until NOTIFY or the poll interval; until ``stop`` is set.
        ``on_notify``: other channels the same connection listens on, each with what to call
        with a notification's payload (``engram worker run``: the extraction wake).

        When the database goes away (a restart, a dropped link) the listening connection
        and the drain fail; both are opened again with back-off (``orchestrator.health``)
        until the server answers, and the queue is drained from where it stood: a batch
        in flight was rolled back with its connection, so nothing is lost or written
        twice. ``component`` reports the state (``/readyz`` under ``engram up``). A worker
        whose model is no longer the active one stops (``ModelMismatch``)."""
        component = component or Component("embedding worker")
        supervise(component, lambda: self._listen(listen_dsn, stop, on_batch, component,
                                                   on_notify or {}), stop,
                  backoff=Backoff(0.5, max(self.settings.worker_poll_s, 1.0) * 6),
                  permanent=(ModelMismatch,))

    def _listen(self, listen_dsn: str, stop: threading.Event,
                on_batch: Callable[[BatchReport], None] | None, component: Component,
                on_notify: Mapping[str, Callable[[str], None]]) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(listen_dsn, autocommit=True, connect_timeout=10) as listener:
            for channel in (NOTIFY_CHANNEL, *on_notify):
                listener.execute(sql.SQL("listen {}").format(sql.Identifier(channel)))
            # What was sent while no connection listened (a restart, a dropped link) is lost:
            # each channel's callback runs once now, as if it had been woken.
            for woken in on_notify.values():
                woken("")
            while not stop.is_set():
                progress = DrainProgress(self.pending, component)

                def each(b: BatchReport, progress: DrainProgress = progress) -> None:
                    progress.batch(b)
                    if on_batch is not None:
                        on_batch(b)

                drained = self.drain(wait_for_retries=False, stop=stop, on_batch=each)
                progress.done()
                component.ok(f"listening; the last drain embedded {drained.rows} rows")
                wait = self._next_retry_in()
                timeout = self.settings.worker_poll_s if wait is None else min(
                    wait + 0.01, self.settings.worker_poll_s)
                for note in listener.notifies(timeout=max(0.01, timeout), stop_after=1):
                    call = on_notify.get(note.channel)
                    if call is not None:
                        call(note.payload)


# A drain that runs longer than this says how far it is, this often, in the log.
PROGRESS_EVERY_S = 15.0


class DrainProgress:
    """What a long drain has done, in the log and in its component's detail: an ingest of a
    few thousand chunks keeps the worker embedding for minutes (about 13 chunks of 256 tokens
    a second on one CPU core), and the log said nothing until it was over. Every
    ``every_s`` of a drain: the rows embedded so far, the rate, how many still wait
    (``pending``) and about how long they will take; a drain that logged progress says when
    it is done. A short drain (an agent's item, a small folder) logs nothing. The component
    keeps the line as its log detail only: ``/readyz`` answers anyone and shows none of it
    (the counts span tenants)."""

    def __init__(self, pending: Callable[[], int], component: Component | None = None,
                 every_s: float = PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pending, self.component, self.every_s, self.clock = pending, component, every_s, clock
        self.started = self.last = clock()
        self.rows = 0
        self.logged = False

    def batch(self, b: BatchReport) -> None:
        self.rows += b.embedded_rows
        now = self.clock()
        if now - self.last < self.every_s:
            return
        self.last, self.logged = now, True
        elapsed = now - self.started
        rate = self.rows / elapsed if elapsed > 0 else 0.0
        waiting = self.pending()
        left = (f", about {_duration(waiting / rate)} left at this rate" if rate > 0 and waiting
                else "")
        line = (f"embedding: {self.rows:,} rows in {_duration(elapsed)} ({rate:.1f} rows/s); "
                f"{waiting:,} still waiting{left}")
        log.info(line)
        if self.component is not None:
            self.component.working(line)

    def done(self) -> None:
        if self.logged:
            elapsed = self.clock() - self.started
            log.info("embedding: done, %s rows in %s (%.1f rows/s)", f"{self.rows:,}",
                     _duration(elapsed), self.rows / elapsed if elapsed > 0 else 0.0)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def backoff_schedule(base_s: float, attempts: int) -> list[float]:
    """Delays before retries 1..attempts-1 (the last try marks the row failed)."""
    return [base_s * math.pow(2, i) for i in range(max(0, attempts - 1))]
