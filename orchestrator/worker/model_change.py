"""Changing the embedding model with recall running: register, backfill, activate.

Order of work (``engram models backfill NAME`` runs 1-2, ``engram models
activate NAME`` runs 3):

1. **register** the candidate (name, dimension, text prefixes) unless the registry
   knows it, as ``engram_dba``;
2. **backfill**, resumable, touching only what lacks the candidate's vectors,
   while recall keeps reading the active model's:

   * *same dimension*: every ready row's text gets the candidate's vector in
     ``worker.embedding_cache`` (per tenant and content hash); rows stay as they are;
   * *another dimension* (the columns are typed ``vector(d)``): a generated
     migration. Each embeddable table first gets a shadow column
     ``embedding_next vector(D)`` and ``embedded_next_at`` (instant, no rewrite),
     the cache and the shadow column are filled in batches, then the shadow
     column's ANN indexes are built ``CONCURRENTLY`` from the definitions of the
     live ones (HNSW, or VectorChord's on that tier). A row whose text changed and
     was embedded again by the active model after its shadow was written
     (``embedded_at > embedded_next_at``) counts as lacking and is done again;

3. **activate**, refused while any ready row lacks the candidate's vector (the
   counts per table say how many) and, for a new dimension, while a shadow index
   is missing or invalid. One transaction then makes the candidate's vectors the
   live ones and flips the registry, whose trigger raises the generation:

   * *same dimension*: each ready row's ``embedding`` is swapped to its cached
     vector (chained like any worker write);
   * *another dimension*: the old column goes (with its indexes and state check),
     the shadow takes its name, the shadow indexes take the old names, the
     column privileges move over, other vector columns of the old dimension (RAPTOR
     centroids) are emptied for the next derive run to recompute, and the chain is
     re-baselined for the tables whose row images changed (as a migration does).
     The state checks are validated right after, outside the flip's lock.

Recall reads the active generation in its statement's snapshot and follows the
flip (``orchestrator/recall/service.py``); a worker following the flip loads the
new model (``QueueWorker``'s ``loader``). Roles: backfill writes as
``engram_worker``; the shadow columns, their indexes and the flip to another
dimension are DDL, run by the admin (migrating) connection.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, text

from orchestrator.worker.queue import (
    EMBEDDABLE,
    EmbeddableTable,
    PassageEmbedder,
    embed_isolated,
    hash_expr,
    quote_ident,
    vector_literal,
)
from orchestrator.worker.registry import (
    ModelMismatch,
    RegisteredModel,
    read_active,
    read_model,
)

log = logging.getLogger("engram.worker.models")

SHADOW = "embedding_next"
# PostgreSQL's longest identifier (NAMEDATALEN - 1); Engram's index names are ASCII.
NAME_BYTES = 63
SHADOW_AT = "embedded_next_at"
Progress = Callable[[int, int, str | None], None]


@dataclass(frozen=True)
class Coverage:
    """How much of one table the candidate covers: ``ready`` rows hold the active model's
    vectors, ``covered`` of them also the candidate's."""

    table: str
    ready: int
    covered: int

    @property
    def missing(self) -> int:
        return self.ready - self.covered


@dataclass
class BackfillReport:
    model: str
    same_dimension: bool
    rows: int = 0  # rows given the candidate's vector (from the model or the cache)
    texts: int = 0  # distinct texts the candidate embedded
    failed: list[str] = field(default_factory=list)  # "table row: error", one per poisoned text
    indexes_built: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Activation:
    model: RegisteredModel  # as active now (its new generation)
    previous: RegisteredModel
    switched: dict[str, int]  # rows whose live vector changed, per table


def _table(t: EmbeddableTable) -> str:
    return quote_ident(t.name)


def _keys(t: EmbeddableTable, alias: str = "t") -> str:
    return ", ".join(f"{alias}.{quote_ident(k)}" for k in ("tenant_id", *t.key_columns))


def _has_shadow(conn: Connection, t: EmbeddableTable) -> bool:
    return bool(conn.execute(text(
        "select exists (select 1 from pg_attribute where attrelid = to_regclass(:t) "
        "and attname = :c and not attisdropped)"), {"t": t.name, "c": SHADOW}).scalar())


def _lacking(t: EmbeddableTable, same_dimension: bool) -> str:
    """Rows that lack the candidate's vector (``t`` is the table, ``:m`` the candidate)."""
    if same_dimension:
        return ("t.embed_state = 'ready' and not exists (select 1 from worker.embedding_cache c "
                "where c.tenant_id = t.tenant_id and c.model = :m "
                f"and c.content_hash = {hash_expr(t)})")
    return (f"t.embed_state = 'ready' and (t.{SHADOW} is null or t.{SHADOW_AT} < t.embedded_at)")


class ModelChange:
    """Backfill and activation of a candidate model over the ``EMBEDDABLE`` tables.

    ``worker``: an ``engram_worker`` engine (reads texts, writes vectors and the cache);
    ``admin``: the migrating connection, needed to register a model and for the DDL of a
    dimension change."""

    def __init__(self, worker: Engine, admin: Engine | None = None, *,
                 tables: Sequence[EmbeddableTable] = EMBEDDABLE) -> None:
        self.worker = worker
        self.admin = admin
        self.tables = tuple(tables)

    # -- the registry ------------------------------------------------------------

    def _admin(self, what: str) -> Engine:
        if self.admin is None:
            raise ModelMismatch(f"{what} needs the admin (migrating) connection")
        return self.admin

    def models(self, name: str) -> tuple[RegisteredModel, RegisteredModel]:
        """(candidate, active); ``ModelMismatch`` when the candidate is not registered."""
        with self.worker.connect() as conn:
            candidate = read_model(conn, name)
            active = read_active(conn)
        if candidate is None:
            raise ModelMismatch(f"{name} is not registered in worker.embedding_models; "
                                "`engram models backfill` registers it")
        return candidate, active

    def register(self, name: str, dimension: int, *, query_prefix: str = "",
                 passage_prefix: str = "") -> RegisteredModel:
        """Register ``name`` (inactive) as engram_dba; the registered row when it exists,
        refused if it exists with another dimension or other prefixes."""
        with self.worker.connect() as conn:
            known = read_model(conn, name)
        if known is None:
            with self._admin("registering a model").begin() as conn:
                conn.execute(text("set local role engram_dba"))
                conn.execute(text(
                    "insert into worker.embedding_models (name, dimension, query_prefix, "
                    "passage_prefix) values (:n, :d, :q, :p) on conflict (name) do nothing"),
                    {"n": name, "d": dimension, "q": query_prefix, "p": passage_prefix})
            with self.worker.connect() as conn:
                known = read_model(conn, name)
            assert known is not None
        if known.dimension != dimension:
            raise ModelMismatch(f"{name} is registered as {known.dimension}-d but the loaded "
                                f"model gives {dimension}-d vectors")
        if (known.query_prefix, known.passage_prefix) != (query_prefix, passage_prefix):
            raise ModelMismatch(
                f"{name} is registered with query prefix {known.query_prefix!r} and passage "
                f"prefix {known.passage_prefix!r}, not {query_prefix!r} and {passage_prefix!r}")
        return known

    # -- how far a candidate is ----------------------------------------------------

    def coverage(self, name: str) -> list[Coverage]:
        candidate, active = self.models(name)
        same = candidate.dimension == active.dimension
        out = []
        with self.worker.connect() as conn:
            for t in self.tables:
                ready = int(conn.execute(text(
                    f"select count(*) from {_table(t)} t where t.embed_state = 'ready'"
                )).scalar_one())
                if not same and not _has_shadow(conn, t):
                    out.append(Coverage(t.name, ready, 0))
                    continue
                missing = int(conn.execute(text(
                    f"select count(*) from {_table(t)} t where {_lacking(t, same)}"),
                    {"m": name}).scalar_one())
                out.append(Coverage(t.name, ready, ready - missing))
        return out

    # -- 2. backfill -------------------------------------------------------------

    def backfill(self, embedder: PassageEmbedder, *, batch: int = 256,
                 on_progress: Progress | None = None) -> BackfillReport:
        """Give every ready row the candidate's vector (cache, and the shadow column for a new
        dimension); only rows that lack it, so a second run resumes where one stopped."""
        name = embedder.model_name
        candidate, active = self.models(name)
        if candidate.dimension != embedder.dimension:
            raise ModelMismatch(f"{name} is registered as {candidate.dimension}-d but the loaded "
                                f"model gives {embedder.dimension}-d vectors")
        if candidate.active:
            raise ModelMismatch(f"{name} is already the active model; nothing to backfill")
        same = candidate.dimension == active.dimension
        report = BackfillReport(name, same)
        if not same:
            self._add_shadow_columns(candidate.dimension)
        total = sum(c.missing for c in self.coverage(name))
        done = 0
        for t in self.tables:
            for rows in self._lacking_rows(t, name, same, batch):
                self._fill(t, rows, embedder, same, report)
                done += len(rows)
                if on_progress is not None:
                    on_progress(min(done, total), max(total, done), t.name)
        if not same:
            report.indexes_built = self.build_shadow_indexes()
        return report

    def _lacking_rows(self, t: EmbeddableTable, name: str, same: bool,
                      batch: int) -> Iterable[list[Any]]:
        """Batches of lacking rows in key order (one pass: a text that fails is not retried)."""
        nkeys = len(t.key_columns)
        after: tuple[Any, ...] | None = None
        keys = _keys(t)
        while True:
            cursor = f" and ({keys}) > ({', '.join(f':a{i}' for i in range(nkeys + 1))})" \
                if after is not None else ""
            params: dict[str, Any] = {"m": name, "n": batch}
            if after is not None:
                params.update({f"a{i}": v for i, v in enumerate(after)})
            with self.worker.connect() as conn:
                rows = conn.execute(text(
                    f"select {keys}, {hash_expr(t)} as hash, t.{quote_ident(t.text_column)} as body, "
                    "c.embedding::text as cached "
                    f"from {_table(t)} t left join worker.embedding_cache c on "
                    f"c.tenant_id = t.tenant_id and c.model = :m and c.content_hash = {hash_expr(t)} "
                    f"where {_lacking(t, same)}{cursor} order by {keys} limit :n"), params).all()
            if not rows:
                return
            yield list(rows)
            last = rows[-1]
            after = tuple(last[: nkeys + 1])

    def _fill(self, t: EmbeddableTable, rows: list[Any], embedder: PassageEmbedder, same: bool,
              report: BackfillReport) -> None:
        name = embedder.model_name
        vectors: dict[tuple[Any, bytes], str] = {}
        todo: dict[tuple[Any, bytes], str] = {}
        for r in rows:
            key = (r.tenant_id, bytes(r.hash))
            if r.cached is not None:
                vectors[key] = str(r.cached)
            else:
                todo.setdefault(key, r.body)
        keys = list(todo)
        results = embed_isolated(embedder, [todo[k] for k in keys]) if keys else []
        fresh = []
        for k, v in zip(keys, results, strict=True):
            if isinstance(v, str):
                report.failed.append(f"{t.name} (tenant {k[0]}, text {k[1].hex()[:12]}): {v}")
                continue
            vectors[k] = vector_literal(np.asarray(v, dtype=np.float32))
            fresh.append({"t": k[0], "m": name, "h": k[1], "v": vectors[k]})
        report.texts += len(fresh)
        with self.worker.begin() as conn:
            if fresh:
                conn.execute(text(
                    "insert into worker.embedding_cache (tenant_id, model, content_hash, embedding) "
                    "values (:t, :m, :h, cast(:v as vector)) on conflict do nothing"), fresh)
            if same:
                report.rows += sum(1 for r in rows if (r.tenant_id, bytes(r.hash)) in vectors)
                return
            # The hash in the WHERE: a row whose text changed since it was read keeps no
            # vector of the old text (it is pending again, or lacking at the next run).
            updates = [{"v": vectors[(r.tenant_id, bytes(r.hash))], "h": bytes(r.hash),
                        **{f"k{i}": v for i, v in enumerate(r[: len(t.key_columns) + 1])}}
                       for r in rows if (r.tenant_id, bytes(r.hash)) in vectors]
            if updates:
                where = " and ".join(f"{quote_ident(k)} = :k{i}"
                                     for i, k in enumerate(("tenant_id", *t.key_columns)))
                conn.execute(text(
                    f"update {_table(t)} t set {SHADOW} = cast(:v as vector), "
                    f"{SHADOW_AT} = clock_timestamp() where {where} and {hash_expr(t)} = :h"),
                    updates)
                report.rows += len(updates)

    # -- the generated migration of a new dimension ----------------------------------

    def _add_shadow_columns(self, dimension: int) -> None:
        admin = self._admin("a model of another dimension (new columns)")
        with admin.begin() as conn:
            for t in self.tables:
                current = conn.execute(text(
                    "select format_type(atttypid, atttypmod) from pg_attribute "
                    "where attrelid = to_regclass(:t) and attname = :c and not attisdropped"),
                    {"t": t.name, "c": SHADOW}).scalar()
                if current is not None and current != f"vector({dimension})":
                    raise ModelMismatch(
                        f"{t.name}.{SHADOW} is {current}, left by a backfill of another "
                        f"candidate; `engram models backfill --discard` removes it first")
                conn.execute(text(
                    f"alter table {_table(t)} add column if not exists {SHADOW} vector({dimension}), "
                    f"add column if not exists {SHADOW_AT} timestamptz"))
                # embedded_at too: a shadow older than the live vector is stale.
                conn.execute(text(f"grant select ({SHADOW}, {SHADOW_AT}, embedded_at), "
                                  f"update ({SHADOW}, {SHADOW_AT}) on {_table(t)} to engram_worker"))
                conn.execute(text(
                    f"comment on column {_table(t)}.{SHADOW} is 'The candidate embedding model''s "
                    "vector during a change of dimension (engram models backfill); becomes "
                    "embedding at activation.'"))

    def discard_shadow(self) -> list[str]:
        """Drop shadow columns (and their indexes) a dimension backfill left: the way back."""
        dropped = []
        with self._admin("discarding a backfill").begin() as conn:
            for t in self.tables:
                if _has_shadow(conn, t):
                    conn.execute(text(f"alter table {_table(t)} drop column {SHADOW}, "
                                      f"drop column if exists {SHADOW_AT}"))
                    dropped.append(t.name)
        return dropped

    def _ann_indexes(self, conn: Connection, t: EmbeddableTable, column: str
                     ) -> list[tuple[str, str, bool]]:
        """(name, definition, valid) of every index over exactly ``column``."""
        rows = conn.execute(text(
            "select c.relname, pg_get_indexdef(i.indexrelid), i.indisvalid from pg_index i "
            "join pg_class c on c.oid = i.indexrelid "
            "join pg_attribute a on a.attrelid = i.indrelid and a.attnum = i.indkey[0] "
            "where i.indrelid = to_regclass(:t) and i.indnatts = 1 and a.attname = :c "
            "order by 1"), {"t": t.name, "c": column}).all()
        return [(str(r[0]), str(r[1]), bool(r[2])) for r in rows]

    def build_shadow_indexes(self) -> list[str]:
        """Each live ANN index, rebuilt CONCURRENTLY over the shadow column (an invalid one
        left by an interrupted build is dropped and built again)."""
        admin = self._admin("building the new column's indexes")
        built = []
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            schema_of = {t.name: t.name.split(".")[0] for t in self.tables}
            for t in self.tables:
                if not _has_shadow(conn, t):
                    continue
                shadows = {n: valid for n, _, valid in self._ann_indexes(conn, t, SHADOW)}
                for name, definition, _ in self._ann_indexes(conn, t, "embedding"):
                    target = shadow_index_name(name)
                    if shadows.get(target) is True:
                        continue
                    if target in shadows:
                        conn.execute(text(f"drop index concurrently {schema_of[t.name]}.{target}"))
                    sql = re.sub(r"^CREATE INDEX \S+ ON ",
                                 f"CREATE INDEX CONCURRENTLY {target} ON ", definition)
                    sql = re.sub(r"\(embedding ", f"({SHADOW} ", sql, count=1)
                    log.info("building %s on %s", target, t.name)
                    _raw(conn, sql)
                    built.append(f"{schema_of[t.name]}.{target}")
        return built

    # -- 3. activate -------------------------------------------------------------

    def activate(self, name: str) -> Activation:
        """Make ``name``'s vectors the live ones and flip the registry in one transaction;
        refused, with the counts, while a ready row lacks its vector."""
        candidate, active = self.models(name)
        if candidate.active:
            return Activation(candidate, candidate, {})
        if candidate.dimension == active.dimension:
            return self._activate_same(candidate)
        return self._activate_dimension(candidate)

    def _refuse_incomplete(self, conn: Connection, candidate: RegisteredModel,
                           active: RegisteredModel, same: bool) -> None:
        missing = []
        for t in self.tables:
            if not same and not _has_shadow(conn, t):
                missing.append((t.name, -1))
                continue
            n = int(conn.execute(text(
                f"select count(*) from {_table(t)} t where {_lacking(t, same)}"),
                {"m": candidate.name}).scalar_one())
            if n:
                missing.append((t.name, n))
        if missing:
            detail = "; ".join(f"{table}: no {candidate.dimension}-d column yet" if n < 0
                               else f"{table}: {n} rows" for table, n in missing)
            total = sum(n for _, n in missing if n > 0)
            raise ModelMismatch(
                f"the backfill of {candidate.name} is incomplete ({total} ready rows lack its "
                f"vector; {detail}); run `engram models backfill {candidate.name}` and activate "
                f"again. Recall stays on {active.describe()}")

    def _flip_registry(self, conn: Connection, name: str) -> None:
        conn.execute(text("update worker.embedding_models set active = false where active"))
        conn.execute(text("update worker.embedding_models set active = true where name = :n"),
                     {"n": name})

    def _locked(self, conn: Connection, name: str) -> tuple[RegisteredModel, RegisteredModel]:
        # FOR UPDATE: waits for embedding batches in flight (they hold the active row FOR
        # SHARE), and no batch starts under a model that is no longer active.
        conn.execute(text("select name from worker.embedding_models where active or name = :n "
                          "order by name for update"), {"n": name})
        candidate = read_model(conn, name)
        assert candidate is not None
        return candidate, read_active(conn)

    def _activate_same(self, candidate: RegisteredModel) -> Activation:
        switched: dict[str, int] = {}
        with self.worker.begin() as conn:
            candidate, active = self._locked(conn, candidate.name)
            self._refuse_incomplete(conn, candidate, active, True)
            for t in self.tables:
                result = conn.execute(text(
                    f"update {_table(t)} t set embedding = c.embedding, embed_model = :m, "
                    "embedded_at = clock_timestamp() from worker.embedding_cache c "
                    "where t.embed_state = 'ready' and c.tenant_id = t.tenant_id "
                    f"and c.model = :m and c.content_hash = {hash_expr(t)}"),
                    {"m": candidate.name})
                switched[t.name] = int(result.rowcount)
            self._flip_registry(conn, candidate.name)
            now = read_active(conn)
        return Activation(now, active, switched)

    def _activate_dimension(self, candidate: RegisteredModel) -> Activation:
        admin = self._admin("activating a model of another dimension (column swap)")
        switched: dict[str, int] = {}
        checks = []
        with admin.begin() as conn:
            candidate, active = self._locked(conn, candidate.name)
            self._refuse_incomplete(conn, candidate, active, False)
            for t in self.tables:
                shadows = {n: valid for n, _, valid in self._ann_indexes(conn, t, SHADOW)}
                for name, _, _ in self._ann_indexes(conn, t, "embedding"):
                    if shadows.get(shadow_index_name(name)) is not True:
                        raise ModelMismatch(
                            f"the index {shadow_index_name(name)} on {t.name} is not built yet "
                            f"(or an interrupted build left it invalid); run `engram models "
                            f"backfill {candidate.name}` again")
            superuser = bool(conn.execute(text(
                "select rolsuper from pg_roles where rolname = current_user")).scalar())
            for t in self.tables:
                checks.append(self._swap_columns(conn, t))
                switched[t.name] = int(conn.execute(text(
                    f"select count(*) from {_table(t)} where embed_state = 'ready'")).scalar_one())
            emptied = self._empty_other_vectors(conn, active.dimension, candidate.dimension)
            if superuser:
                # The row images changed without a write: chain them again (as 0010 does).
                chained = set(conn.execute(text(
                    "select provenance.chained_tables()::text")).scalars())
                for table in sorted({t.name for t in self.tables} | set(emptied)):
                    if table in chained:
                        conn.execute(text("select provenance.baseline(cast(:t as regclass))"),
                                     {"t": table})
            else:
                log.warning("the flip ran as a role that is not a superuser: the chain was not "
                            "re-baselined, so `engram audit verify` reports the embeddable rows "
                            "as changed since their last event")
            self._flip_registry(conn, candidate.name)
            now = read_active(conn)
        # Outside the flip's lock: validation scans but blocks no reader or writer.
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table, constraint in checks:
                conn.execute(text(f"alter table {quote_ident(table)} validate constraint "
                                  f"{quote_ident(constraint)}"))
        return Activation(now, active, switched)

    def _swap_columns(self, conn: Connection, t: EmbeddableTable) -> tuple[str, str]:
        table = _table(t)
        schema, relname = t.name.split(".")
        conn.execute(text(f"update {table} set {SHADOW} = null, {SHADOW_AT} = null "
                          f"where embed_state <> 'ready' and {SHADOW} is not null"))
        # Whoever could read or write the old column may do the same with the new one, and
        # only that: the backfill's own grants go first.
        conn.execute(text(f"revoke select ({SHADOW}), update ({SHADOW}) on {table} "
                          "from engram_worker"))
        grants = conn.execute(text(
            "select r.rolname, x.privilege_type from pg_attribute a "
            "cross join lateral aclexplode(a.attacl) x left join pg_roles r on r.oid = x.grantee "
            "where a.attrelid = to_regclass(:t) and a.attname = 'embedding'"), {"t": t.name}).all()
        for grantee, privilege in grants:
            to = "public" if grantee is None else quote_ident(grantee)
            conn.execute(text(f"grant {privilege} ({SHADOW}) on {table} to {to}"))
        live = [n for n, _, _ in self._ann_indexes(conn, t, "embedding")]
        views = _dependent_views(conn, t.name, "embedding")
        for view in reversed(views):
            conn.execute(text(f"drop view {view.name}"))
        conn.execute(text(f"alter table {table} drop column embedding, drop column {SHADOW_AT}"))
        conn.execute(text(f"alter table {table} rename column {SHADOW} to embedding"))
        for view in views:
            view.create(conn)
        for name in live:
            conn.execute(text(f"alter index {schema}.{shadow_index_name(name)} rename to {name}"))
        constraint = f"ck_{relname}_embedding_matches_state"
        conn.execute(text(f"alter table {table} add constraint {constraint} check "
                          "((embed_state = 'ready') = (embedding is not null)) not valid"))
        conn.execute(text(f"comment on column {table}.embedding is 'Vector of the active "
                          "embedding model (worker.embedding_models).'"))
        return t.name, constraint

    def _empty_other_vectors(self, conn: Connection, old: int, new: int) -> list[str]:
        """Other vector columns of the old dimension (RAPTOR centroids) become the new
        dimension, empty: derived from embeddings, they are recomputed by the next run."""
        names = {t.name for t in self.tables}
        rows = conn.execute(text(
            "select n.nspname || '.' || c.relname, a.attname from pg_attribute a "
            "join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace "
            "join pg_type ty on ty.oid = a.atttypid "
            "where ty.typname = 'vector' and a.atttypmod = :d and c.relkind = 'r' "
            "and not a.attisdropped and n.nspname in ('sources', 'knowledge', 'memory')"),
            {"d": old}).all()
        emptied = []
        for table, column in rows:
            if table in names and column == "embedding":
                continue
            conn.execute(text(f"alter table {quote_ident(table)} alter column {quote_ident(column)} "
                              f"type vector({new}) using null"))
            emptied.append(str(table))
        return emptied


@dataclass(frozen=True)
class _View:
    """A view over a swapped column, as it must be made again (definition, options, owner,
    grants, comment): ``select t.*`` views name the old column until they are rebuilt."""

    name: str
    definition: str
    options: list[str]
    owner: str
    grants: list[tuple[str | None, str]]
    comment: str | None

    def create(self, conn: Connection) -> None:
        options = f" with ({', '.join(self.options)})" if self.options else ""
        _raw(conn, f"create view {self.name}{options} as {self.definition}")
        conn.execute(text(f"alter view {self.name} owner to {quote_ident(self.owner)}"))
        for grantee, privilege in self.grants:
            if grantee != self.owner:
                to = "public" if grantee is None else quote_ident(grantee)
                conn.execute(text(f"grant {privilege} on {self.name} to {to}"))
        if self.comment is not None:
            statement = conn.execute(text("select format('comment on view %s is %L', "
                                          "cast(:v as text), cast(:c as text))"),
                                     {"v": self.name, "c": self.comment}).scalar_one()
            _raw(conn, statement)


def _raw(conn: Connection, sql: str) -> None:
    """SQL text taken from the catalog, sent as it is (no bind-parameter parsing)."""
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql)
    finally:
        cursor.close()


def _dependent_views(conn: Connection, table: str, column: str) -> list[_View]:
    """Views that read ``table.column``, and views over those, in creation order."""
    rows = conn.execute(text("""
        with recursive deps(oid, depth) as (
            select distinct r.ev_class, 1 from pg_depend d
              join pg_rewrite r on r.oid = d.objid
              join pg_attribute a on a.attrelid = d.refobjid and a.attnum = d.refobjsubid
             where d.classid = 'pg_rewrite'::regclass and d.refobjid = to_regclass(:t)
               and a.attname = :c
            union
            select distinct r.ev_class, deps.depth + 1 from deps
              join pg_depend d on d.refobjid = deps.oid and d.classid = 'pg_rewrite'::regclass
              join pg_rewrite r on r.oid = d.objid
             where r.ev_class <> deps.oid)
        select c.oid::regclass::text as name, pg_get_viewdef(c.oid) as definition,
               coalesce(c.reloptions, '{}') as options, pg_get_userbyid(c.relowner) as owner,
               obj_description(c.oid, 'pg_class') as comment, max(deps.depth) as depth
          from deps join pg_class c on c.oid = deps.oid where c.relkind = 'v'
         group by c.oid order by depth, name"""), {"t": table, "c": column}).all()
    views = []
    for r in rows:
        grants = conn.execute(text(
            "select g.rolname, x.privilege_type from pg_class c "
            "cross join lateral aclexplode(c.relacl) x left join pg_roles g on g.oid = x.grantee "
            "where c.oid = to_regclass(:v)"), {"v": r.name}).all()
        views.append(_View(str(r.name), str(r.definition), list(r.options), str(r.owner),
                           [(g[0], str(g[1])) for g in grants], r.comment))
    return views


def shadow_index_name(live: str) -> str:
    """``ix_chunks_embedding_hnsw`` -> ``ix_chunks_embedding_next_hnsw``, cut to the 63 bytes
    PostgreSQL keeps of a name (it cuts the CREATE's name the same way: a tenant's own index
    on ``working_memory`` is 62 characters before the shadow column's name goes in)."""
    if "_embedding_" in live:
        return live.replace("_embedding_", f"_{SHADOW}_", 1)[:NAME_BYTES]
    return f"{live}_next"[:NAME_BYTES]
