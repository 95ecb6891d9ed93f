"""The recall statement: every lane in one SQLAlchemy Core statement, in execution order.

``build_recall_statement`` composes CTEs from mapped columns; nothing here is a
handwritten SQL string and nothing is a stored recall function. The statement
runs inside ``bound_session``, so forced row level security decides what every
lane sees: pools, statistics and catalogs are all computed over the caller's
visible rows only.

Execution order, as laid out below:

1. **dense**: a top-k ``<=>`` scan over ``sources.chunks.embedding`` (the HNSW
   index with iterative scans, so invisible rows never starve the pool), ranked
   with ``row_number``;
2. **lexical**: chunks whose tsvector matches any query lexeme (GIN index on
   ``(tenant_id, lexical)``), scored with Okapi BM25. Term frequencies and the
   per-term document frequency come from the matched tsvectors themselves
   (``count(*) over (partition by lexeme)`` inside the match set is exactly df
   over the visible corpus, because every visible chunk holding the term
   matched); N and the average length come from ``recall.lexical_stats``;
3. **title**: documents whose complete title key equals a word n-gram of the
   question (an expression-index probe); a named title that is contained in
   another named title loses the direct-subject bit; each named document
   contributes its best chunks;
4. **fusion**: reciprocal rank fusion ``sum(1 / (rrf_k + rank))`` over the
   dense and lexical ranks of each chunk (both contributions when both found
   it); title chunks join the same candidate set with their direct bit;
5. **hydration**: only now are chunks and documents joined (archived and
   snoozed documents drop out here);
6. **catalogs**: the Area catalog and the Project catalog (Active and Waiting
   projects only);
7. one ``union all`` of every branch with one row shape, plus the exact scope
   objects (name, description) each row is shared into.

Lanes over the knowledge and derived-memory tables join the union as those
tables land; every branch of the union has the row shape of ``COLUMNS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    CompoundSelect,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    null,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import (
    ARRAY,
    DOUBLE_PRECISION,
    JSONB,
    REGCONFIG,
    TIMESTAMP,
    TSQUERY,
    UUID,
    aggregate_order_by,
)
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.types import TypeEngine

from orchestrator.config import Settings, get_settings
from orchestrator.db.models import EMBEDDING_DIMENSION, Chunk, Document, Scope
from orchestrator.recall.plan import FULL_PLAN, PlanShape
from orchestrator.recall.tables import LexicalStat

# The text search configuration sources.tg_chunks__inherit builds chunks.lexical
# with; the query must be analysed the same way or BM25 compares different tokens.
TS_CONFIG = "english"

PROJECT_STATES = ("Active", "Waiting")

Double: DOUBLE_PRECISION[float] = DOUBLE_PRECISION()

# The one row shape of every branch of the union, in column order.
COLUMNS: dict[str, TypeEngine[Any]] = {
    "lane": Text(),
    "chunk_id": UUID(as_uuid=True),
    "document_id": UUID(as_uuid=True),
    "ordinal": Integer(),
    "text": Text(),
    "char_start": Integer(),
    "char_end": Integer(),
    "embedding": Vector(EMBEDDING_DIMENSION),
    "dense_rank": BigInteger(),
    "dense_distance": Double,
    "lexical_rank": BigInteger(),
    "bm25": Double,
    "title_rank": BigInteger(),
    "direct": Boolean(),
    "rrf": Double,
    "collection": Text(),
    "path": Text(),
    "title": Text(),
    "kind": Text(),
    "state": Text(),
    "area": Text(),
    "scopes": ARRAY(UUID(as_uuid=True)),
    "author": Text(),
    "created_at": TIMESTAMP(timezone=True),
    "updated_at": TIMESTAMP(timezone=True),
    "pinned": Boolean(),
    "item_count": BigInteger(),
}


@dataclass(frozen=True)
class StatementLimits:
    """Bounds of every candidate pool and the scoring constants (from settings)."""

    dense_k: int = 40
    lexical_k: int = 40
    title_docs: int = 8
    title_chunks: int = 3
    title_max_words: int = 16
    catalog_limit: int = 50
    rrf_k: int = 60
    bm25_k1: float = 1.2
    bm25_b: float = 0.75

    @classmethod
    def from_settings(cls, settings: Settings) -> StatementLimits:
        return cls(
            dense_k=settings.recall_dense_k, lexical_k=settings.recall_lexical_k,
            title_docs=settings.recall_title_docs, title_chunks=settings.recall_title_chunks,
            title_max_words=settings.recall_title_max_words,
            catalog_limit=settings.recall_catalog_limit, rrf_k=settings.recall_rrf_k,
            bm25_k1=settings.recall_bm25_k1, bm25_b=settings.recall_bm25_b,
        )


def _row(**columns: Any) -> list[ColumnElement[Any]]:
    """One branch's select list in ``COLUMNS`` order; absent columns are typed nulls."""
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        raise ValueError(f"not columns of the recall row: {sorted(unknown)}")
    out: list[ColumnElement[Any]] = []
    for name, type_ in COLUMNS.items():
        value = columns.get(name)
        expr = null() if value is None else value
        out.append(cast(expr, type_).label(name))
    return out


def _current(doc: Any) -> ColumnElement[bool]:
    """Neither archived nor snoozed: what recall may show."""
    return and_(doc.archived_at.is_(None),
                or_(doc.snoozed_until.is_(None), doc.snoozed_until <= func.now()))


def build_recall_statement(shape: PlanShape = FULL_PLAN,
                           limits: StatementLimits | None = None) -> Select[Any]:
    """The recall statement for ``shape``; parameters ``question`` and ``query_embedding``.

    Production passes ``FULL_PLAN``; other shapes exist for the plan study.
    """
    lim = limits or StatementLimits.from_settings(get_settings())
    question: BindParameter[str] = bindparam("question", type_=Text())
    query_embedding: BindParameter[Any] = bindparam(
        "query_embedding", type_=Vector(EMBEDDING_DIMENSION))
    cfg = cast(literal(TS_CONFIG), REGCONFIG)
    c = Chunk.__table__.c
    d = Document.__table__.c
    distance = c.embedding.cosine_distance(query_embedding)
    # RLS already limits every scan to the bound tenant; saying so in the
    # statement lets the planner use the tenant-leading indexes the same way for
    # every role, and keeps a role without RLS (a superuser benchmark) honest.
    tenant = func.auth.tenant_id()

    lane_rows: list[Select[Any]] = []
    branches: list[Select[Any]] = []

    # 1. dense: ORDER BY distance LIMIT k directly over the index scan.
    if shape.dense:
        dense_scan = (
            select(c.id.label("chunk_id"), c.document_id, distance.label("distance"))
            .where(c.tenant_id == tenant, c.embedding.is_not(None))
            .order_by(distance)
            .limit(lim.dense_k)
            .cte("dense_scan")
        )
        dense = select(
            dense_scan.c.chunk_id, dense_scan.c.document_id, dense_scan.c.distance,
            func.row_number().over(order_by=(dense_scan.c.distance, dense_scan.c.chunk_id))
            .label("rank"),
        ).cte("dense")
        lane_rows.append(select(dense.c.chunk_id, dense.c.document_id,
                                literal("dense").label("lane"), dense.c.rank,
                                cast(dense.c.distance, Double).label("score")))

    # 2. lexical: Okapi BM25 over the GIN-matched candidate set.
    if shape.lexical:
        query_terms = select(
            func.unnest(func.tsvector_to_array(func.to_tsvector(cfg, question)))
            .label("lexeme")
        ).cte("query_terms")
        # plainto_tsquery quotes each lexeme; joining them with | asks for any term.
        any_term = cast(func.replace(cast(func.plainto_tsquery(cfg, question), Text),
                                     " & ", " | "), TSQUERY)
        matches = (
            select(c.id.label("chunk_id"), c.document_id, c.lexical, c.token_count)
            .where(c.tenant_id == tenant, c.lexical.op("@@")(any_term))
            .cte("lexical_matches")
        )
        entry = func.unnest(matches.c.lexical).table_valued(
            "lexeme", "positions", "weights", name="entry")
        hits = (
            select(
                matches.c.chunk_id, matches.c.document_id, matches.c.token_count,
                entry.c.lexeme,
                func.coalesce(func.array_length(entry.c.positions, 1), 1).label("tf"),
                func.count().over(partition_by=entry.c.lexeme).label("df"),
            )
            .select_from(matches)
            .join(entry, true())
            .where(entry.c.lexeme.in_(select(query_terms.c.lexeme)))
            .cte("lexical_hits")
        )
        stats = select(
            cast(func.coalesce(func.sum(LexicalStat.chunks), 0), Double).label("n"),
            cast(func.coalesce(func.sum(LexicalStat.tokens), 0), Double).label("total"),
        ).where(LexicalStat.tenant_id == tenant).cte("lexical_corpus")
        k1 = bindparam("bm25_k1", lim.bm25_k1, type_=Double)
        b = bindparam("bm25_b", lim.bm25_b, type_=Double)
        df = cast(hits.c.df, Double)
        tf = cast(hits.c.tf, Double)
        avgdl = stats.c.total / func.nullif(stats.c.n, 0, type_=Double)
        idf = func.ln(1 + (stats.c.n - df + 0.5) / (df + 0.5))
        norm = k1 * (1 - b + b * cast(hits.c.token_count, Double) / avgdl)
        bm25 = func.sum(idf * tf / (tf + norm))
        scored = (
            select(hits.c.chunk_id, hits.c.document_id, bm25.label("bm25"))
            .select_from(hits)
            .join(stats, true())
            .group_by(hits.c.chunk_id, hits.c.document_id)
            .order_by(bm25.desc(), hits.c.chunk_id)
            .limit(lim.lexical_k)
            .cte("lexical_scored")
        )
        lexical = select(
            scored.c.chunk_id, scored.c.document_id, scored.c.bm25,
            func.row_number().over(order_by=(scored.c.bm25.desc(), scored.c.chunk_id))
            .label("rank"),
        ).cte("lexical")
        lane_rows.append(select(lexical.c.chunk_id, lexical.c.document_id,
                                literal("lexical").label("lane"), lexical.c.rank,
                                cast(lexical.c.bm25, Double).label("score")))
        # The corpus statistics BM25 used, for the trace (visible corpus only).
        branches.append(select(*_row(
            lane=literal("lexical_stats"), item_count=cast(stats.c.n, BigInteger),
            bm25=avgdl)))

    # 3. title: complete titles named in the question.
    titled = None
    if shape.title:
        words = select(
            func.regexp_split_to_array(func.recall.title_key(question), " ",
                                       type_=ARRAY(Text())).label("w")
        ).cte("question_words")
        n_words = func.cardinality(words.c.w)
        first = func.generate_series(1, n_words).table_valued("i").render_derived(name="first_word")
        last = func.generate_series(
            first.c.i, func.least(n_words, first.c.i + (lim.title_max_words - 1))
        ).table_valued("j").render_derived(name="last_word")
        ngrams = (
            select(func.array_to_string(words.c.w[first.c.i:last.c.j], " ").label("key"))
            .select_from(words).join(first, true()).join(last, true())
            .cte("question_ngrams")
        )
        doc_key = func.recall.title_key(d.title)
        named = (
            select(d.id.label("document_id"), doc_key.label("key"))
            .where(d.tenant_id == tenant, doc_key.in_(select(ngrams.c.key)), doc_key != "",
                   _current(d))
            .order_by(func.length(doc_key).desc(), d.id)
            .limit(lim.title_docs)
            .cte("named_titles")
        )
        other = named.alias("other_title")
        padded = literal(" ")
        contained = exists().where(
            other.c.key != named.c.key,
            func.strpos(padded + other.c.key + padded, padded + named.c.key + padded) > 0,
        )
        titled = select(named.c.document_id, (~contained).label("direct")).cte("title_subjects")
        ranked = (
            select(
                c.id.label("chunk_id"), c.document_id,
                func.row_number().over(partition_by=c.document_id,
                                       order_by=(distance.nulls_last(), c.ordinal))
                .label("rank"),
            )
            .where(c.tenant_id == tenant, c.document_id.in_(select(titled.c.document_id)))
            .subquery("title_ranked")
        )
        title_chunks = (
            select(ranked.c.chunk_id, ranked.c.document_id, ranked.c.rank)
            .where(ranked.c.rank <= lim.title_chunks)
            .cte("title_chunks")
        )
        lane_rows.append(select(title_chunks.c.chunk_id, title_chunks.c.document_id,
                                literal("title").label("lane"), title_chunks.c.rank,
                                cast(null(), Double).label("score")))

    # 4. fusion over chunk ids; documents are not joined yet.
    if lane_rows:
        lanes_union = (union_all(*lane_rows) if len(lane_rows) > 1 else lane_rows[0]).cte(
            "lane_ranks")
        lane = lanes_union.c.lane
        rank = lanes_union.c.rank
        rrf_k = bindparam("rrf_k", lim.rrf_k, type_=Double)
        contribution = case((lane.in_(("dense", "lexical")), 1.0 / (rrf_k + cast(rank, Double))),
                            else_=0.0)
        fused = (
            select(
                lanes_union.c.chunk_id, lanes_union.c.document_id,
                func.sum(contribution).label("rrf"),
                func.min(rank).filter(lane == "dense").label("dense_rank"),
                func.min(lanes_union.c.score).filter(lane == "dense").label("dense_distance"),
                func.min(rank).filter(lane == "lexical").label("lexical_rank"),
                func.min(lanes_union.c.score).filter(lane == "lexical").label("bm25"),
                func.min(rank).filter(lane == "title").label("title_rank"),
            )
            .group_by(lanes_union.c.chunk_id, lanes_union.c.document_id)
            .cte("fused")
        )

        # 5. hydration: chunks and documents join the fused candidates.
        chunk = Chunk.__table__
        doc = Document.__table__
        joined = (fused.join(chunk, chunk.c.id == fused.c.chunk_id)
                  .join(doc, and_(doc.c.tenant_id == chunk.c.tenant_id,
                                  doc.c.id == fused.c.document_id)))
        direct: ColumnElement[Any] = literal(False)
        if titled is not None:
            joined = joined.outerjoin(titled, titled.c.document_id == fused.c.document_id)
            direct = func.coalesce(titled.c.direct, False)
        branches.insert(0, select(*_row(
            lane=literal("source"), chunk_id=fused.c.chunk_id, document_id=fused.c.document_id,
            ordinal=chunk.c.ordinal, text=chunk.c.text, char_start=chunk.c.char_start,
            char_end=chunk.c.char_end, embedding=chunk.c.embedding,
            dense_rank=fused.c.dense_rank, dense_distance=fused.c.dense_distance,
            lexical_rank=fused.c.lexical_rank, bm25=fused.c.bm25, title_rank=fused.c.title_rank,
            direct=direct, rrf=fused.c.rrf, collection=doc.c.collection, path=doc.c.path,
            title=doc.c.title, kind=doc.c.kind, state=doc.c.state, area=doc.c.area,
            scopes=doc.c.scopes, author=doc.c.author, created_at=doc.c.created_at,
            updated_at=doc.c.updated_at, pinned=doc.c.pinned,
        )).select_from(joined).where(_current(doc.c)))

    # 6. catalogs: database-derived, from explicit columns only.
    if shape.catalogs:
        areas = (
            select(*_row(
                lane=literal("area"), text=d.area, area=d.area, scopes=d.scopes,
                item_count=func.count(), updated_at=func.max(d.updated_at),
            ))
            .where(d.tenant_id == tenant, d.area.is_not(None), _current(d))
            .group_by(d.area, d.scopes)
            .order_by(d.area)
            .limit(lim.catalog_limit)
        )
        projects = (
            select(*_row(
                lane=literal("project"), document_id=d.id, title=d.title, state=d.state,
                area=d.area, kind=d.kind, collection=d.collection, path=d.path,
                scopes=d.scopes, author=d.author, created_at=d.created_at,
                updated_at=d.updated_at, pinned=d.pinned,
            ))
            .where(d.tenant_id == tenant, d.kind == "project", d.state.in_(PROJECT_STATES),
                   _current(d))
            .order_by(d.area.nulls_last(), d.title)
            .limit(lim.catalog_limit)
        )
        branches += [select(areas.subquery("area_catalog")),
                     select(projects.subquery("project_catalog"))]

    # 7. one union; every row with the exact scope objects it is shared into.
    if not branches:
        raise ValueError(f"plan shape {shape.name!r} has no lanes")
    union: Select[Any] | CompoundSelect[Any] = union_all(*branches) if len(branches) > 1 else branches[0]
    rows = union.subquery("recall_rows")
    s = Scope.__table__.c
    scope_objects = (
        select(func.coalesce(
            func.jsonb_agg(aggregate_order_by(
                func.jsonb_build_object("name", s.name, "description", s.description), s.name)),
            cast(literal("[]"), JSONB)))
        .where(s.id == func.any(rows.c.scopes))
        .scalar_subquery()
    )
    return select(rows, scope_objects.label("scope_objects"))
