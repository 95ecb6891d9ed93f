"""The recall statement: every lane in one SQLAlchemy Core statement, in execution order.

``build_recall_statement`` composes CTEs from mapped columns; nothing here is a
handwritten SQL string and nothing is a stored recall function. The statement
runs inside ``bound_session``, so forced row level security decides what every
lane sees: pools, statistics, seeds and catalogs are all computed over the
caller's visible rows only. Every lane is bounded (sizes in settings) and every
scan carries the tenant predicate, so the tenant-leading indexes serve every role
the same way.

Execution order, as laid out below:

1. **source lanes** over ``sources.chunks``: *dense* (top-k ``<=>`` over the
   HNSW index with iterative scans, so invisible rows never starve the pool),
   *lexical* (Okapi BM25 over at most ``lexical_rows`` chunks, those of the rarest
   query terms first: df per scope set from ``recall.lexical_terms``, N and the average
   length from ``recall.lexical_stats``, tf from each chunk's own vector), *title*
   (complete titles named in the question; a
   title contained in another named title loses the direct-subject bit);
2. **fusion**: reciprocal rank fusion ``sum(1 / (rrf_k + rank))`` over the dense
   and lexical ranks of each chunk (both contributions when both found it);
3. **hydration**: only now are chunks and documents joined (archived and snoozed
   documents drop out); a chunk whose extracted claims a keyed fact outranks
   carries ``beaten_by``;
4. **entity seeds**: entities whose canonical name or alias equals a word
   n-gram of the question;
5. **knowledge lanes**: *facts* (a bounded candidate set from the
   ``fact_content`` vector index, then only those rows joined to current claims),
   *keyed* (current keyed facts about the seeds, and the keyed facts that beat a
   source candidate), *graph* (a bounded recursive walk from the seeds whose
   lateral adjacency probe uses the subject and object indexes); every claim is
   hydrated through ``knowledge.effective_claims`` by id, which says whether a
   keyed fact outranks it;
6. **derived memory lanes**: communities (of the seeds, and by summary
   embedding), RAPTOR nodes (by embedding, plus the best roots as overviews), the
   asker's working memory (by embedding, plus the most recent items), profiles
   (by summary embedding, plus the seeds' profiles), episodes (by embedding,
   plus the most recent), observations at or above the confidence gate,
   decisions (by embedding) and their causal links;
7. **timeline**: the neighbours in time (within the collection, by
   ``occurred_at``) or in the document (adjacent chunks) of the best fused
   source candidates;
8. **item fusion**: every lane row carries its contribution (the fused RRF for
   source chunks, ``weight / (rrf_k + rank)`` for the other lanes, where the
   ``mode`` bind parameter doubles the causal or the timeline lanes' weight and
   never turns a lane off); rows of the same item are summed into one row that
   lists the lanes and ranks that found it;
9. **catalogs** (Area catalog; Project catalog of Active and Waiting projects),
   the seeds and the BM25 corpus statistics, for the tail and the trace;
10. one ``union all`` with the exact scope objects (name, description) each row
    is shared into, and the active embedding model's generation (read in the same
    snapshot as the vectors, so the recaller can tell whether its question's
    embedding belongs to them).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    CompoundSelect,
    Integer,
    LargeBinary,
    Select,
    Text,
    TypeDecorator,
    and_,
    any_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import (
    ARRAY,
    DOUBLE_PRECISION,
    JSONB,
    REGCONFIG,
    TIMESTAMP,
    TSQUERY,
    UUID,
    aggregate_order_by,
    array,
    distinct_on,
)
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.types import TypeEngine

from orchestrator.config import Settings, get_settings
from orchestrator.db.derive_models import Extraction
from orchestrator.db.knowledge_models import (
    RECALLABLE_CONFIDENCE,
    Community,
    Decision,
    DecisionLink,
    Entity,
    Episode,
    FactClaim,
    FactContent,
    Observation,
    Profile,
    RaptorNode,
    WorkingMemoryItem,
    effective_claims,
)
from orchestrator.db.models import Chunk, Document, Scope
from orchestrator.db.worker_models import EmbeddingModel
from orchestrator.recall.plan import FULL_PLAN, PlanShape
from orchestrator.recall.tables import LexicalStat, LexicalTerm, LexicalTermDelta

# The text search configuration sources.tg_chunks__inherit builds chunks.lexical
# with; the query must be analysed the same way or BM25 compares different tokens.
TS_CONFIG = "english"

PROJECT_STATES = ("Active", "Waiting")
INDEX_TIERS = ("pgvector", "vectorchord")
# The tiers differ in the chunks' vector index only (HNSW or vchordrq, chosen by migrations
# 0003 and 0070); the statement reads the same columns on both.
MODES = ("causal", "timeline")
# The column every row carries: the generation of the active embedding model.
MODEL_GENERATION = "embedding_model_generation"
# The lanes whose weight a mode doubles.
MODE_LANES = {"causal": ("decisions", "causal"), "timeline": ("timeline", "episodes")}

Double: DOUBLE_PRECISION[float] = DOUBLE_PRECISION()
UUIDS = ARRAY(UUID(as_uuid=True))
TSTZ = TIMESTAMP(timezone=True)

# The one row shape of every branch of the union, in column order.
COLUMNS: dict[str, TypeEngine[Any]] = {
    "lane": Text(),
    "item_table": Text(),
    "item_id": UUID(as_uuid=True),
    "chunk_id": UUID(as_uuid=True),
    "document_id": UUID(as_uuid=True),
    "ordinal": Integer(),
    "text": Text(),
    "char_start": Integer(),
    "char_end": Integer(),
    "section": JSONB(),
    # No dimension: the statement serves whichever model is active (0080_model_generations).
    "embedding": Vector(),
    "dense_rank": BigInteger(),
    "dense_distance": Double,
    "lexical_rank": BigInteger(),
    "bm25": Double,
    "title_rank": BigInteger(),
    "direct": Boolean(),
    "rrf": Double,
    "lane_rank": BigInteger(),
    "lane_score": Double,
    "contribution": Double,
    "semantic_distance": Double,
    "weight": Double,
    "lane_ranks": JSONB(),
    "collection": Text(),
    "path": Text(),
    "title": Text(),
    "kind": Text(),
    "state": Text(),
    "area": Text(),
    "scopes": UUIDS,
    "author": Text(),
    "created_at": TSTZ,
    "updated_at": TSTZ,
    "occurred_at": TSTZ,
    "ended_at": TSTZ,
    "pinned": Boolean(),
    "item_count": BigInteger(),
    "session_id": Text(),
    "level": Integer(),
    "subject": Text(),
    "predicate": Text(),
    "object": Text(),
    "epistemic_kind": Text(),
    "perspective_key": Text(),
    "author_role": Text(),
    "confidence": Double,
    "authority": Integer(),
    "fact_key": Text(),
    "as_of": TSTZ,
    "outcome": Text(),
    "related_id": UUID(as_uuid=True),
    "relation": Text(),
    "depth": Integer(),
    "beaten_by": UUID(as_uuid=True),
}


@dataclass(frozen=True)
class StatementLimits:
    """Bounds of every candidate pool and the scoring constants (from settings)."""

    dense_k: int = 40
    lexical_k: int = 40
    lexical_rows: int = 2000
    title_docs: int = 8
    title_chunks: int = 3
    title_max_words: int = 16
    title_common_share: float = 0.5
    title_common_min: int = 20
    catalog_limit: int = 50
    rrf_k: int = 10
    dense_weight: float = 1.0
    lexical_weight: float = 1.5
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    seed_limit: int = 8
    seed_max_words: int = 6
    fact_k: int = 20
    keyed_k: int = 20
    graph_depth: int = 2
    graph_fanout: int = 8
    graph_k: int = 30
    memory_k: int = 5
    recent_k: int = 3
    raptor_roots: int = 2
    observation_k: int = 10
    causal_k: int = 10
    timeline_seeds: int = 5
    timeline_share: float = 0.5
    timeline_span: int = 2
    mode_weight: float = 2.0

    @classmethod
    def from_settings(cls, settings: Settings) -> StatementLimits:
        return cls(
            dense_k=settings.recall_dense_k, lexical_k=settings.recall_lexical_k,
            lexical_rows=settings.recall_lexical_rows,
            title_docs=settings.recall_title_docs, title_chunks=settings.recall_title_chunks,
            title_max_words=settings.recall_title_max_words,
            title_common_share=settings.recall_title_common_share,
            title_common_min=settings.recall_title_common_min,
            catalog_limit=settings.recall_catalog_limit, rrf_k=settings.recall_rrf_k,
            dense_weight=settings.recall_dense_weight, lexical_weight=settings.recall_lexical_weight,
            bm25_k1=settings.recall_bm25_k1, bm25_b=settings.recall_bm25_b,
            seed_limit=settings.recall_seed_limit, seed_max_words=settings.recall_seed_max_words,
            fact_k=settings.recall_fact_k, keyed_k=settings.recall_keyed_k,
            graph_depth=settings.recall_graph_depth, graph_fanout=settings.recall_graph_fanout,
            graph_k=settings.recall_graph_k, memory_k=settings.recall_memory_k,
            recent_k=settings.recall_recent_k, raptor_roots=settings.recall_raptor_roots,
            observation_k=settings.recall_observation_k, causal_k=settings.recall_causal_k,
            timeline_seeds=settings.recall_timeline_seeds,
            timeline_share=settings.recall_timeline_share,
            timeline_span=settings.recall_timeline_span,
            mode_weight=settings.recall_mode_weight,
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


def _current_claim(c: Any) -> ColumnElement[bool]:
    """True now (valid time) and still believed (record time): knowledge.current_claims' rule."""
    return and_(c.superseded_at.is_(None),
                or_(c.valid_from.is_(None), c.valid_from <= func.now()),
                or_(c.valid_to.is_(None), c.valid_to > func.now()))


def _ranked(inner: Any, name: str, order: tuple[str, ...]) -> Any:
    """``inner`` (already bounded) with a 1-based ``rank`` in ``order``, as a CTE.

    ``order`` names columns of ``inner``; a leading ``-`` sorts that one descending. The
    last one is the row's id: it only makes the bound above deterministic, and never a
    rank, so rows tied on every other column share one (competition) rank instead of
    being told apart by a random id.
    """
    sub = inner.subquery(f"{name}_pool")
    cols = [sub.c[c[1:]].desc() if c.startswith("-") else sub.c[c] for c in order]
    return select(sub, func.rank().over(order_by=cols[:-1] or cols).label("rank")).cte(name)


class _Builder:
    """Holds the statement's parameters and shared CTEs while the lanes are laid out."""

    def __init__(self, shape: PlanShape, lim: StatementLimits, index_tier: str,
                 own_index: uuid.UUID | None = None) -> None:
        if index_tier not in INDEX_TIERS:
            raise ValueError(f"unknown index tier {index_tier!r}; one of {', '.join(INDEX_TIERS)}")
        self.shape = shape
        self.own_index = own_index
        self.lim = lim
        self.index_tier = index_tier
        self.question: BindParameter[str] = bindparam("question", type_=Text())
        self.query_embedding: BindParameter[Any] = bindparam("query_embedding", type_=Vector())
        self.mode: BindParameter[str | None] = bindparam("mode", None, type_=Text())
        self.session: BindParameter[str | None] = bindparam("session", None, type_=Text())
        # The calendar days the question names (``recall.dates.day_bounds``): each day's first
        # instant and the next day's, in UTC.
        self.days: BindParameter[Any] = bindparam("days", None,
                                                  type_=ARRAY(TIMESTAMP(timezone=True)))
        self.days_end: BindParameter[Any] = bindparam("days_end", None,
                                                      type_=ARRAY(TIMESTAMP(timezone=True)))
        self.rrf_k = bindparam("rrf_k", lim.rrf_k, type_=Double)
        # RLS already limits every scan to the bound tenant; saying so in the
        # statement lets the planner use the tenant-leading indexes the same way
        # for every role, and keeps a role without RLS (a superuser benchmark) honest.
        self.tenant = func.auth.tenant_id(type_=UUID(as_uuid=True))
        self.lane_rows: list[Select[Any]] = []  # fused per item
        self.source_rows: Any = None
        self.extra_rows: list[Select[Any]] = []  # catalogs, seeds, corpus statistics
        # The lexical lane's per-term df and visible corpus CTEs (``portable_lexical``), for
        # the title lane's test of a title most visible chunks hold.
        self.lexical_df: Any = None
        self.lexical_corpus: Any = None

    # -- helpers -------------------------------------------------------------------

    def distance(self, column: Any) -> Any:
        return column.cosine_distance(self.query_embedding)

    def holds(self, table: Any) -> Any:
        """Whether the caller sees any row of ``table`` in the tenant: an uncorrelated EXISTS,
        evaluated once (a one-time filter), so a lane over a table that holds nothing for
        the tenant skips its index walk. An HNSW scan filtered to a tenant with no rows would
        otherwise read the whole graph of every other tenant looking for one."""
        t = table.__table__.c
        return exists().where(t.tenant_id == self.tenant)

    def own(self, columns: Any) -> list[Any]:
        """For a tenant with its own vector indexes (plans.py), its id as a literal beside
        the tenant filter of a lane ordered by embedding distance: the only form of a partial
        index's predicate a reused plan can prove. Nothing for everyone else."""
        if self.own_index is None:
            return []
        return [columns.tenant_id == literal_column(f"'{uuid.UUID(str(self.own_index))}'::uuid")]

    def weight(self, lane: str) -> Any:
        boosted = [m for m, lanes in MODE_LANES.items() if lane in lanes]
        if not boosted:
            return literal(1.0, Double)
        return case((self.mode.in_(boosted), bindparam("mode_weight", self.lim.mode_weight, type_=Double)),
                    else_=literal(1.0, Double))

    def contribution(self, lane: str, rank: Any) -> Any:
        return self.weight(lane) / (self.rrf_k + cast(rank, Double))

    def lane_ranks(self, lane: Any, rank: Any, score: Any = None) -> Any:
        """``{lane: [rank, score]}``: what the trace shows for one lane row."""
        return func.jsonb_build_object(lane, func.jsonb_build_array(rank, score))

    # -- 1-3. source lanes, fusion, hydration ----------------------------------------

    def sources(self, seeds: Any | None = None) -> Any:
        """Dense, lexical and title lanes fused per chunk; returns the ``fused`` CTE or None.
        ``seeds`` (the entity seeds' CTE) names documents too: see the title lane."""
        s, lim = self.shape, self.lim
        c = Chunk.__table__.c
        d = Document.__table__.c
        distance = self.distance(c.embedding)
        tenant = self.tenant
        rows: list[Select[Any]] = []

        if s.dense:
            dense = _ranked(
                select(c.id.label("chunk_id"), c.document_id, distance.label("distance"))
                .where(c.tenant_id == tenant, c.embedding.is_not(None), *self.own(c))
                .order_by(distance).limit(lim.dense_k),
                "dense", ("distance", "chunk_id"))
            rows.append(select(dense.c.chunk_id, dense.c.document_id, literal("dense").label("lane"),
                               dense.c.rank, cast(dense.c.distance, Double).label("score")))

        # The same lexical lane on both index tiers (docs/database.md, "Index tiers"): its
        # statistics are the caller's visible corpus, never another tenant's or scope's.
        if s.lexical:
            rows.append(self.portable_lexical())

        titled = None
        if s.title:
            split = func.regexp_split_to_array(func.recall.title_key(self.question), " ",
                                               type_=ARRAY(Text()))
            # The question's words, and the same without articles: "how do I add a library
            # target?" names the page titled add_library ("add library"), as "add library"
            # would (stop 46). Both sequences' n-grams go into the one probe.
            words = select(split.label("w")).cte("question_split").prefix_with("MATERIALIZED")
            bare = func.array_remove(func.array_remove(func.array_remove(
                words.c.w, "a", type_=ARRAY(Text())), "an", type_=ARRAY(Text())), "the",
                type_=ARRAY(Text()))
            sequences = (
                select(words.c.w.label("w")).select_from(words)
                .union_all(select(bare.label("w")).select_from(words).where(bare != words.c.w))
            # MATERIALIZED: referenced once, the CTE would be inlined and the question split
            # (and keyed) again for every n-gram: a 4,000-character question took 57 s.
            ).cte("question_words").prefix_with("MATERIALIZED")
            n_words = func.cardinality(sequences.c.w)
            first = func.generate_series(1, n_words).table_valued("i").render_derived(name="first_word")
            last = func.generate_series(
                first.c.i, func.least(n_words, first.c.i + (lim.title_max_words - 1))
            ).table_valued("j").render_derived(name="last_word")
            ngrams = (
                select(func.array_to_string(sequences.c.w[first.c.i:last.c.j], " ").label("key"))
                .select_from(sequences).join(first, true()).join(last, true())
                .cte("question_ngrams")
            )
            # The stored key (0014), compared with = so the probe stays an index probe
            # under RLS. The n-grams go in as one array: joined as rows, the planner
            # estimated them at a million (two generate_series) and hashed them against every
            # document of the tenant (35 ms at 45,000 documents, to find none); = ANY of an
            # array is one probe of (tenant_id, title_key) per n-gram.
            doc_key = d.title_key
            # (the cast makes ANY take the array, not the rows of a subquery)
            ngram_keys: Any = cast(select(func.array_agg(ngrams.c.key)).scalar_subquery(),
                                   ARRAY(Text()))
            if seeds is not None:
                # An entity the question names by one of its aliases names the document
                # titled by the entity's name: "what does Priya work on?" names the note
                # "Priya Raman" once "Priya" is her alias. Same probe, more keys; the
                # entity and the document are each read under their own RLS.
                seed_keys = cast(select(func.array_agg(func.recall.title_key(seeds.c.canonical_name)))
                                 .scalar_subquery(), ARRAY(Text()))
                ngram_keys = func.array_cat(ngram_keys, seed_keys, type_=ARRAY(Text()))
            candidates = (
                select(d.id.label("document_id"), doc_key.label("key"), d.title)
                .where(d.tenant_id == tenant, doc_key == any_(ngram_keys), doc_key != "",
                       _current(d))
                .order_by(func.length(doc_key).desc(), d.id)
                .limit(lim.title_docs)
            )
            if self.lexical_df is not None:
                # A title whose every word more than ``title_common_share`` of the visible
                # chunks outside its document hold (and at least ``title_common_min`` of
                # them) is the corpus's topic, not a document the question singles out, when
                # the question asks about more than it: "where does npm keep its cache?"
                # names npm, not the page titled "npm" of npm's own docs (562 of the 626
                # other chunks hold "npm"); "what is npm?" still names that page, and a long
                # note whose own chunks say its title stays named. Such a title names
                # nothing (the trace lists it). The dfs are the lexical lane's, over what
                # the reader may see, less the document's own chunks (as if each held the
                # word); a word the question does not hold (a title named through an
                # entity's alias) counts as rare.
                cfg = cast(literal(TS_CONFIG), REGCONFIG)
                title_words = func.tsvector_to_array(func.to_tsvector(cfg, d.title),
                                                     type_=ARRAY(Text()))
                lexemes = func.unnest(title_words).table_valued("lexeme").render_derived(
                    name="title_lexeme")
                df, corpus = self.lexical_df, self.lexical_corpus
                own = Chunk.__table__.alias("title_own_chunk")
                own_chunks = (select(func.count()).select_from(own)
                              .where(own.c.tenant_id == tenant, own.c.document_id == d.id)
                              .scalar_subquery())
                rarest = (select(func.min(func.coalesce(df.c.df, 0)))
                          .select_from(lexemes.outerjoin(df, df.c.lexeme == lexemes.c.lexeme))
                          .scalar_subquery())
                beyond = exists().where(df.c.lexeme != func.all_(title_words))
                candidates = candidates.add_columns(
                    (rarest - own_chunks).label("elsewhere"), own_chunks.label("own_chunks"),
                    beyond.label("beyond"))
                named_all = candidates.cte("named_titles_all")
                share = bindparam("title_common_share", lim.title_common_share, type_=Double)
                least = bindparam("title_common_min", lim.title_common_min, type_=BigInteger)
                others = select(corpus.c.n).scalar_subquery() - named_all.c.own_chunks
                common = func.coalesce(and_(
                    named_all.c.beyond, named_all.c.elsewhere >= least,
                    cast(named_all.c.elsewhere, Double) > share * others), False)
                named = (select(named_all.c.document_id, named_all.c.key)
                         .where(~common).cte("named_titles"))
                self.extra_rows.append(select(*_row(
                    lane=literal("title_common"), text=named_all.c.title,
                    item_count=named_all.c.elsewhere,
                    lane_rank=cast(others, BigInteger))).where(common))
            else:
                named = candidates.cte("named_titles")
            other = named.alias("other_title")
            padded = literal(" ")
            contained = exists().where(
                other.c.key != named.c.key,
                func.strpos(padded + other.c.key + padded, padded + named.c.key + padded) > 0,
            )
            # A document dated a day the question names is a subject it names too ("what
            # happened on December 1?" names the daily note of that day). One probe of
            # (tenant_id, collection, occurred_at) per day: PostgreSQL 18 skips over the
            # collections; no day, no probe. Both bounds come in as values: "day + interval
            # '1 day'" (a stable function of the day) was only a filter, so the probe read
            # every document dated after the day. A day more than ``title_docs`` documents
            # are dated (a chat's turns, a busy feed) names none of them: it is a period, and
            # which eight of its documents went first would be arbitrary.
            day = func.unnest(self.days, self.days_end).table_valued(
                "first", "after").render_derived(name="named_day")
            dated = (
                select(d.id.label("document_id"))
                .select_from(day)
                .join(Document.__table__, and_(
                    d.tenant_id == tenant, d.occurred_at >= day.c.first,
                    d.occurred_at < day.c.after, _current(d)))
                .limit(lim.title_docs + 1)
                .cte("dated_subjects")
            )
            few = select(func.count()).select_from(dated).scalar_subquery() <= lim.title_docs
            subjects = union_all(select(named.c.document_id, (~contained).label("direct")),
                                 select(dated.c.document_id, true().label("direct")).where(few)
                                 ).subquery("subjects")
            titled = (select(subjects.c.document_id, func.bool_or(subjects.c.direct).label("direct"))
                      .group_by(subjects.c.document_id).cte("title_subjects"))
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
            rows.append(select(title_chunks.c.chunk_id, title_chunks.c.document_id,
                               literal("title").label("lane"), title_chunks.c.rank,
                               cast(null(), Double).label("score")))

        if not rows:
            return None
        lanes_union = (union_all(*rows) if len(rows) > 1 else rows[0]).cte("lane_ranks")
        lane = lanes_union.c.lane
        rank = lanes_union.c.rank
        dense_w = bindparam("dense_weight", self.lim.dense_weight, type_=Double)
        lexical_w = bindparam("lexical_weight", self.lim.lexical_weight, type_=Double)
        contribution = case((lane == "dense", dense_w / (self.rrf_k + cast(rank, Double))),
                            (lane == "lexical", lexical_w / (self.rrf_k + cast(rank, Double))),
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

        chunk = Chunk.__table__
        doc = Document.__table__
        joined = (fused.join(chunk, and_(chunk.c.tenant_id == tenant, chunk.c.id == fused.c.chunk_id))
                  .join(doc, and_(doc.c.tenant_id == tenant, doc.c.id == fused.c.document_id)))
        direct: ColumnElement[Any] = literal(False)
        if titled is not None:
            joined = joined.outerjoin(titled, titled.c.document_id == fused.c.document_id)
            direct = func.coalesce(titled.c.direct, False)
        beaten = self.contradiction(fused) if s.keyed else None
        if beaten is not None:
            joined = joined.outerjoin(beaten, beaten.c.chunk_id == fused.c.chunk_id)
        # One entry per source lane that found the chunk (jsonb_strip_nulls drops the others).
        ranks = func.jsonb_strip_nulls(func.jsonb_build_object(*[
            part for name, rank_, score in (
                ("dense", fused.c.dense_rank, fused.c.dense_distance),
                ("lexical", fused.c.lexical_rank, fused.c.bm25),
                ("title", fused.c.title_rank, None))
            for part in (name, case((rank_.is_(None), null()),
                                    else_=func.jsonb_build_array(rank_, score)))]))
        hydrated = select(*_row(
            lane=literal("source"), item_table=literal("sources.chunks"), item_id=fused.c.chunk_id,
            chunk_id=fused.c.chunk_id, document_id=fused.c.document_id,
            ordinal=chunk.c.ordinal, text=chunk.c.text, char_start=chunk.c.char_start,
            char_end=chunk.c.char_end, section=chunk.c.section, embedding=chunk.c.embedding,
            dense_rank=fused.c.dense_rank, dense_distance=fused.c.dense_distance,
            lexical_rank=fused.c.lexical_rank, bm25=fused.c.bm25, title_rank=fused.c.title_rank,
            direct=direct, rrf=fused.c.rrf, contribution=fused.c.rrf, lane_ranks=ranks,
            semantic_distance=fused.c.dense_distance, weight=literal(1.0, Double),
            collection=doc.c.collection, path=doc.c.path,
            title=doc.c.title, kind=doc.c.kind, state=doc.c.state, area=doc.c.area,
            scopes=doc.c.scopes, author=doc.c.author, created_at=doc.c.created_at,
            updated_at=doc.c.updated_at, occurred_at=doc.c.occurred_at, pinned=doc.c.pinned,
            beaten_by=beaten.c.beaten if beaten is not None else None,
        )).select_from(joined).where(_current(doc.c))
        self.source_rows = hydrated.cte("source_rows")
        # What hydration dropped (visible to the caller, but archived or snoozed), so the
        # trace can tell "never found" from "found, then hidden by its document's state".
        self.extra_rows.append(select(*_row(
            lane=literal("hydration_dropped"), item_table=literal("sources.chunks"),
            item_id=fused.c.chunk_id, chunk_id=fused.c.chunk_id, document_id=fused.c.document_id,
            title=doc.c.title, lane_ranks=ranks, rrf=fused.c.rrf,
            relation=case((doc.c.archived_at.is_not(None), "archived"), else_="snoozed"),
        )).select_from(joined).where(~_current(doc.c)))
        self.lane_rows.append(select(self.source_rows))
        return self.source_rows

    def portable_lexical(self) -> Select[Any]:
        """The lexical lane on the portable tier: Okapi BM25 over a bounded set of chunks.

        1. the query's lexemes, analysed as ``chunks.lexical`` is (``TS_CONFIG``);
        2. each one's df over the caller's visible corpus: ``recall.lexical_terms`` and the
           deltas not folded into it yet, summed over the scope sets RLS lets the caller see
           (0041), and N
           and the average length from ``recall.lexical_stats``, so a score never depends
           on a hidden row;
        3. candidates: the chunks holding the rarest term, then the next rarest, ... until
           ``lexical_rows`` chunks are taken (a term whose chunks would pass the budget gets
           what is left of it, the more common terms none). When the query terms' dfs sum
           to the budget or less, that is every chunk holding any of them, as before;
           otherwise the budget goes to the terms with the largest idf, and a chunk that
           holds only common terms may be missed;
        4. BM25 of each candidate over every query term it holds (tf from its own vector),
           the best ``lexical_k``.
        """
        lim, tenant = self.lim, self.tenant
        c = Chunk.__table__.c
        lt = LexicalTerm.__table__.c
        ld = LexicalTermDelta.__table__.c
        cfg = cast(literal(TS_CONFIG), REGCONFIG)
        analysed = (func.unnest(func.tsvector_to_array(func.to_tsvector(cfg, self.question)))
                    .table_valued("lexeme").render_derived(name="query_lexeme"))
        terms = select(analysed.c.lexeme).cte("query_terms")
        # df: the folded counts (one probe per term) plus the deltas not folded yet (few: the
        # worker folds them; each is unnested once).
        delta = func.unnest(ld.lexemes).table_valued("lexeme").render_derived(name="delta_term")
        counts = union_all(
            select(lt.lexeme, lt.chunks.label("n"))
            .where(lt.tenant_id == tenant, lt.lexeme.in_(select(terms.c.lexeme))),
            select(delta.c.lexeme, cast(ld.sign, BigInteger))
            .select_from(LexicalTermDelta.__table__.join(delta, true()))
            .where(ld.tenant_id == tenant, delta.c.lexeme.in_(select(terms.c.lexeme))),
        ).subquery("lexical_counts")
        term_df = (
            select(terms.c.lexeme, cast(func.coalesce(func.sum(counts.c.n), 0), BigInteger).label("df"))
            .select_from(terms.outerjoin(counts, counts.c.lexeme == terms.c.lexeme))
            .group_by(terms.c.lexeme)
            .cte("lexical_df")
        )
        # Rarest first: what the terms before this one took of the budget.
        before = cast(func.sum(term_df.c.df).over(order_by=(term_df.c.df, term_df.c.lexeme)),
                      BigInteger) - term_df.c.df
        rows_budget = literal(lim.lexical_rows, BigInteger)
        budget = (
            select(term_df.c.lexeme, term_df.c.df,
                   func.greatest(func.least(term_df.c.df, rows_budget - before), 0).label("take"))
            .where(term_df.c.df > 0)
            .cte("lexical_budget")
        )
        # One GIN probe per term (ts_match_vq is leakproof, 0014), stopped at its share.
        # Each fetched row brings what scoring needs (read once, from the heap row the probe
        # visited: not looked up again by id, 2,000 index probes at 300k chunks).
        term_query = cast(func.quote_literal(budget.c.lexeme), TSQUERY)
        fetched = (select(c.id.label("chunk_id"), c.document_id, c.token_count, c.lexical)
                   .where(c.tenant_id == tenant, c.lexical.op("@@")(term_query))
                   .limit(budget.c.take)
                   .lateral("lexical_term_chunks"))
        candidates = (select(fetched.c.chunk_id, fetched.c.document_id, fetched.c.token_count,
                             fetched.c.lexical)
                      .select_from(budget.join(fetched, true()))
                      .where(budget.c.take > 0).ext(distinct_on(fetched.c.chunk_id))
                      .cte("lexical_candidates"))
        # tf of each query term in a candidate: its vector cut to the query's lexemes first
        # (marked with weight A, the only weight kept; ``chunks.lexical`` carries none), so
        # a chunk unnests the few terms it shares with the question, not its ~30 lexemes.
        query_lexemes = cast(select(func.array_agg(term_df.c.lexeme)).scalar_subquery(), ARRAY(Text()))
        only_query = func.ts_filter(func.setweight(candidates.c.lexical, literal_column("'A'"),
                                                   query_lexemes),
                                    literal_column("'{a}'"))
        entry = func.unnest(only_query).table_valued("lexeme", "positions", "weights", name="entry")
        hits = (
            select(candidates.c.chunk_id, candidates.c.document_id, candidates.c.token_count,
                   term_df.c.df, func.coalesce(func.array_length(entry.c.positions, 1), 1).label("tf"))
            .select_from(candidates
                         .join(entry, true())
                         .join(term_df, term_df.c.lexeme == entry.c.lexeme))
            .cte("lexical_hits")
        )
        stats = select(
            cast(func.coalesce(func.sum(LexicalStat.chunks), 0), Double).label("n"),
            cast(func.coalesce(func.sum(LexicalStat.tokens), 0), Double).label("total"),
        ).where(LexicalStat.tenant_id == tenant).cte("lexical_corpus")
        self.lexical_df, self.lexical_corpus = term_df, stats
        k1 = bindparam("bm25_k1", lim.bm25_k1, type_=Double)
        b = bindparam("bm25_b", lim.bm25_b, type_=Double)
        df = cast(hits.c.df, Double)
        tf = cast(hits.c.tf, Double)
        avgdl = stats.c.total / func.nullif(stats.c.n, 0, type_=Double)
        idf = func.ln(1 + (stats.c.n - df + 0.5) / (df + 0.5))
        norm = k1 * (1 - b + b * cast(hits.c.token_count, Double) / avgdl)
        bm25 = func.sum(idf * tf / (tf + norm))
        lexical = _ranked(
            select(hits.c.chunk_id, hits.c.document_id, bm25.label("bm25"))
            .select_from(hits).join(stats, true())
            .group_by(hits.c.chunk_id, hits.c.document_id)
            .order_by(bm25.desc(), hits.c.chunk_id).limit(lim.lexical_k),
            "lexical", ("-bm25", "chunk_id"))
        # For the trace (visible corpus only): N and the average length, and per query term
        # its df and how many of its chunks the budget let the lane score.
        self.extra_rows.append(select(*_row(
            lane=literal("lexical_stats"), item_count=cast(stats.c.n, BigInteger), bm25=avgdl)))
        self.extra_rows.append(select(*_row(
            lane=literal("lexical_term"), text=budget.c.lexeme, item_count=budget.c.df,
            lane_rank=budget.c.take)))
        return select(lexical.c.chunk_id, lexical.c.document_id, literal("lexical").label("lane"),
                      lexical.c.rank, cast(lexical.c.bm25, Double).label("score"))

    def contradiction(self, fused: Any) -> Any:
        """Per fused chunk, the keyed fact that outranks a claim extracted from it, if any."""
        e = Extraction.__table__.c
        extracted = (select(fused.c.chunk_id, func.unnest(e.claim_ids).label("claim_id"))
                     .select_from(fused.join(Extraction.__table__, and_(
                         e.tenant_id == self.tenant, e.chunk_id == fused.c.chunk_id)))
                     .cte("extracted_claims"))
        ec = effective_claims.alias("extracted_effective")
        # A lateral probe by id keeps the security-barrier view's scan to those claims.
        probe = (select(ec.c.beaten_by)
                 .where(ec.c.tenant_id == self.tenant, ec.c.id == extracted.c.claim_id,
                        ec.c.beaten_by.is_not(None))
                 .limit(1).lateral("extracted_beaten"))
        return (select(extracted.c.chunk_id, func.min(cast(probe.c.beaten_by, Text)).label("beaten"))
                .select_from(extracted.join(probe, true()))
                .group_by(extracted.c.chunk_id)
                .cte("contradicted"))

    # -- 4. entity seeds --------------------------------------------------------------

    def seeds(self) -> Any:
        lim = self.lim
        ent = Entity.__table__.c
        words = select(
            func.regexp_split_to_array(func.coalesce(func.knowledge.normalize_name(self.question), ""),
                                       " ", type_=ARRAY(Text())).label("w")
        ).cte("seed_words").prefix_with("MATERIALIZED")  # split once (see question_words)
        n_words = func.cardinality(words.c.w)
        first = func.generate_series(1, n_words).table_valued("i").render_derived(name="seed_first")
        last = func.generate_series(
            first.c.i, func.least(n_words, first.c.i + (lim.seed_max_words - 1))
        ).table_valued("j").render_derived(name="seed_last")
        grams = (
            select(func.array_agg(func.array_to_string(words.c.w[first.c.i:last.c.j], " "))
                   .label("gram_keys"))
            .select_from(words).join(first, true()).join(last, true())
            .cte("seed_ngrams")
        )
        keys = select(grams.c.gram_keys).scalar_subquery()
        matched = (
            select(func.coalesce(func.knowledge.canonical_entity(ent.id), ent.id).label("entity_id"),
                   func.length(ent.name_key).label("length"))
            .where(ent.tenant_id == self.tenant, ent.name_key != "",
                   or_(ent.name_key.in_(select(func.unnest(grams.c.gram_keys))),
                       ent.alias_keys.op("&&")(keys)))
            .subquery("seed_matches")
        )
        best = (select(matched.c.entity_id, func.max(matched.c.length).label("length"))
                .group_by(matched.c.entity_id)
                .order_by(func.max(matched.c.length).desc(), matched.c.entity_id)
                .limit(lim.seed_limit).subquery("seed_best"))
        seeds = (select(best.c.entity_id, ent.canonical_name, ent.scopes)
                 .join(Entity.__table__, and_(ent.tenant_id == self.tenant, ent.id == best.c.entity_id))
                 .cte("seeds"))
        self.extra_rows.append(select(*_row(
            lane=literal("seed"), item_table=literal("knowledge.entities"), item_id=seeds.c.entity_id,
            subject=seeds.c.canonical_name, scopes=seeds.c.scopes)))
        return seeds

    # -- 5. knowledge lanes --------------------------------------------------------------

    def knowledge(self, seeds: Any | None) -> None:
        s, lim = self.shape, self.lim
        fc = FactClaim.__table__.c
        tenant = self.tenant
        pools: list[Select[Any]] = []  # (claim_id, lane, rank, score, depth)

        if s.facts:
            content = FactContent.__table__.c
            distance = self.distance(content.embedding)
            candidates = (
                select(content.id.label("content_id"), distance.label("distance"))
                .where(self.holds(FactContent), content.tenant_id == tenant,
                       content.embedding.is_not(None), *self.own(content))
                .order_by(distance).limit(lim.fact_k)
                .cte("fact_candidates")
            )
            # Only the candidate contents are joined to their current claims, one readable claim
            # per content: extraction makes several claims of one sentence (one per entity it
            # links), and the same text fact_k times would fill the pool with one sentence.
            one_each = (
                select(fc.id.label("claim_id"), candidates.c.distance)
                .select_from(candidates.join(FactClaim.__table__, and_(
                    fc.tenant_id == tenant, fc.content_id == candidates.c.content_id)))
                .where(_current_claim(fc))
                .ext(distinct_on(candidates.c.content_id))
                .order_by(candidates.c.content_id, fc.id)
                .subquery("fact_claim_per_content")
            )
            claims = (select(one_each.c.claim_id, one_each.c.distance)
                      .order_by(one_each.c.distance, one_each.c.claim_id).limit(lim.fact_k))
            facts = _ranked(claims, "facts", ("distance", "claim_id"))
            pools.append(select(facts.c.claim_id, literal("facts").label("lane"), facts.c.rank,
                                cast(facts.c.distance, Double).label("score"),
                                cast(null(), Integer).label("depth")))

        if s.keyed:
            parts: list[Select[Any]] = []
            if seeds is not None:
                # Current keyed facts about the entities the question names.
                parts.append(
                    select(fc.id.label("claim_id"), literal(0).label("part"), fc.authority, fc.as_of)
                    .where(fc.tenant_id == tenant, fc.fact_key.is_not(None), _current_claim(fc),
                           fc.subject_id.in_(select(seeds.c.entity_id)))
                    .order_by(fc.authority.desc(), fc.as_of.desc(), fc.id).limit(lim.keyed_k))
            if self.source_rows is not None:
                # The keyed facts that beat a source candidate's prose join the pool.
                src = self.source_rows
                parts.append(
                    select(src.c.beaten_by.label("claim_id"), literal(1).label("part"),
                           cast(null(), Integer).label("authority"), cast(null(), TSTZ).label("as_of"))
                    .where(src.c.beaten_by.is_not(None)).distinct())
            if parts:
                keyed = _ranked(union_all(*parts) if len(parts) > 1 else parts[0], "keyed",
                                ("part", "-authority", "-as_of", "claim_id"))
                pools.append(select(keyed.c.claim_id, literal("keyed").label("lane"), keyed.c.rank,
                                    cast(null(), Double).label("score"),
                                    cast(null(), Integer).label("depth")))

        if s.graph and seeds is not None:
            walk0 = select(seeds.c.entity_id.label("entity_id"), literal(0).label("depth"),
                           array([seeds.c.entity_id]).label("path"),
                           cast(null(), UUID(as_uuid=True)).label("claim_id"),
                           cast(null(), Double).label("confidence"))
            walk = walk0.cte("graph_walk", recursive=True)
            w = walk.alias("graph_step")
            other = case((fc.subject_id == w.c.entity_id, fc.object_id), else_=fc.subject_id)
            # The lateral adjacency probe: both directions through the subject and object indexes.
            edge = (
                select(fc.id.label("claim_id"), other.label("other"), fc.confidence)
                .where(fc.tenant_id == tenant, fc.object_id.is_not(None), _current_claim(fc),
                       or_(fc.subject_id == w.c.entity_id, fc.object_id == w.c.entity_id))
                .order_by(fc.confidence.desc(), fc.authority.desc(), fc.id)
                .limit(lim.graph_fanout)
                .lateral("graph_edge")
            )
            walk = walk.union_all(
                select(edge.c.other, w.c.depth + 1, w.c.path + array([edge.c.other]),
                       edge.c.claim_id, edge.c.confidence)
                .select_from(w.join(edge, true()))
                .where(w.c.depth < lim.graph_depth, ~(edge.c.other == func.any(w.c.path)))
            )
            edges = (
                select(walk.c.claim_id, func.min(walk.c.depth).label("depth"),
                       func.max(walk.c.confidence).label("confidence"))
                .where(walk.c.claim_id.is_not(None))
                .group_by(walk.c.claim_id)
                .order_by(func.min(walk.c.depth), func.max(walk.c.confidence).desc(), walk.c.claim_id)
                .limit(lim.graph_k)
            )
            graph = _ranked(edges, "graph", ("depth", "-confidence", "claim_id"))
            pools.append(select(graph.c.claim_id, literal("graph").label("lane"), graph.c.rank,
                                cast(null(), Double).label("score"), graph.c.depth))

        if not pools:
            return
        # Materialized: a small set probed by id, never re-run per row of the view below.
        pool = ((union_all(*pools) if len(pools) > 1 else pools[0]).cte("claim_pool")
                .prefix_with("MATERIALIZED"))
        # Hydration by id through the security-barrier view: current claims only, with the
        # keyed fact (if any) that outranks and contradicts each.
        ec = effective_claims.alias("claim")
        # LIMIT 1 keeps the probe inside the lateral (one parameterised scan per pooled
        # claim) instead of letting the planner evaluate the view for every claim.
        hydrate = (select(ec).where(ec.c.tenant_id == tenant, ec.c.id == pool.c.claim_id)
                   .limit(1).lateral("claim_hydrated"))
        # The content and both entities are probed by primary key per hydrated claim, each
        # in a LIMIT 1 lateral: under RLS the planner estimates every scan at one row and
        # would otherwise put the entities outside and re-run the claim probes per entity.
        ct, et = FactContent.__table__.c, Entity.__table__
        contents = (select(ct.embedding).where(ct.tenant_id == tenant, ct.id == hydrate.c.content_id)
                    .limit(1).lateral("claim_content"))
        subject = (select(et.c.canonical_name)
                   .where(et.c.tenant_id == tenant, et.c.id == hydrate.c.subject_id)
                   .limit(1).lateral("claim_subject"))
        obj = (select(et.c.canonical_name)
               .where(et.c.tenant_id == tenant, et.c.id == hydrate.c.object_id)
               .limit(1).lateral("claim_object"))
        self.lane_rows.append(select(*_row(
            lane=pool.c.lane, item_table=literal("knowledge.fact_claim"), item_id=hydrate.c.id,
            text=hydrate.c.text, embedding=contents.c.embedding,
            lane_rank=pool.c.rank, lane_score=pool.c.score, weight=literal(1.0, Double),
            semantic_distance=case((pool.c.lane == "facts", pool.c.score), else_=null()),
            contribution=case(
                (pool.c.lane == "facts", null()),
                (pool.c.lane == "keyed", self.contribution("keyed", pool.c.rank)),
                else_=self.contribution("graph", pool.c.rank)),
            lane_ranks=self.lane_ranks(pool.c.lane, pool.c.rank, pool.c.score),
            scopes=hydrate.c.scopes, author=hydrate.c.author, created_at=hydrate.c.recorded_at,
            occurred_at=hydrate.c.valid_from, subject=subject.c.canonical_name,
            predicate=hydrate.c.predicate,
            object=func.coalesce(obj.c.canonical_name, hydrate.c.object_value),
            epistemic_kind=cast(hydrate.c.epistemic_kind, Text),
            perspective_key=hydrate.c.perspective_key, author_role=hydrate.c.author_role,
            confidence=hydrate.c.confidence, authority=hydrate.c.authority,
            fact_key=hydrate.c.fact_key, as_of=hydrate.c.as_of, depth=pool.c.depth,
            beaten_by=hydrate.c.beaten_by,
        )).select_from(
            pool.join(hydrate, true()).join(contents, true()).join(subject, true())
            .outerjoin(obj, true())
        ))

    # -- 6. derived memory lanes -----------------------------------------------------------

    def ann(self, table: Any, lane: str, k: int, *where: Any, extra: tuple[Any, ...] = ()) -> Any:
        """Top ``k`` rows of ``table`` by embedding distance, ranked; returns the CTE."""
        t = table.__table__.c
        distance = self.distance(t.embedding)
        inner = (select(t.id, distance.label("distance"), *extra)
                 .where(self.holds(table), t.tenant_id == self.tenant, t.embedding.is_not(None),
                        *self.own(t), *where)
                 .order_by(distance).limit(k))
        return _ranked(inner, f"{lane}_lane", ("distance", "id"))

    def memory_row(self, lane: str, table: Any, pool: Any, **columns: Any) -> Select[Any]:
        """A lane's rows of ``table`` from ``pool`` (id, distance, rank, semantic)."""
        t = table.__table__
        rank = pool.c.rank
        semantic = pool.c.semantic if "semantic" in pool.c else literal(False)
        credited = pool.c.credited if "credited" in pool.c else literal(True)
        distance = pool.c.distance if "distance" in pool.c else None
        return select(*_row(
            lane=literal(lane), item_table=literal(f"{t.schema}.{t.name}"), item_id=t.c.id,
            embedding=t.c.embedding, scopes=t.c.scopes, lane_rank=rank,
            lane_score=distance, weight=self.weight(lane),
            # Found by meaning: ranked later among everything found by meaning (see build);
            # found by structure (seeds, recency, links): its rank within the lane counts.
            semantic_distance=case((semantic, distance), else_=null()),
            contribution=case((semantic, null()), (credited, self.contribution(lane, rank)),
                              else_=literal(0.0, Double)),
            lane_ranks=self.lane_ranks(lane, rank, distance), **columns,
        )).select_from(pool.join(t, and_(t.c.tenant_id == self.tenant, t.c.id == pool.c.id)))

    def derived(self, seeds: Any | None) -> None:
        s, lim = self.shape, self.lim
        tenant = self.tenant

        def ordered(table: Any, *where: Any, order: tuple[Any, ...], k: int,
                    credited: bool) -> Select[Any]:
            """A bounded list ``(id, distance, o, credited)`` of ``table`` in ``order``."""
            t = table.__table__.c
            return (select(t.id, cast(self.distance(t.embedding), Double).label("distance"),
                           func.row_number().over(order_by=order).label("o"),
                           literal(credited).label("credited"))
                    .where(self.holds(table), t.tenant_id == tenant, *where)
                    .order_by(*order).limit(k))

        seed_ids = select(seeds.c.entity_id) if seeds is not None else None

        if s.communities:
            cm = Community.__table__.c
            of_seeds = None
            if seeds is not None:
                of_seeds = ordered(Community, cm.member_entity_ids.op("&&")(
                    select(func.array_agg(seeds.c.entity_id)).scalar_subquery()),
                    order=(func.cardinality(cm.member_entity_ids), cm.id), k=lim.memory_k,
                    credited=True)
            pool = self.merge("communities", self.ann(Community, "communities_ann", lim.memory_k),
                              of_seeds)
            self.lane_rows.append(self.memory_row(
                "communities", Community, pool, text=cm.summary, level=cm.level,
                item_count=func.cardinality(cm.member_entity_ids), created_at=cm.created_at,
                updated_at=cm.built_at))

        if s.raptor:
            rn = RaptorNode.__table__.c
            roots = self.ann(RaptorNode, "raptor_roots", lim.raptor_roots, rn.parent_id.is_(None))
            pool = self.merge("raptor", self.ann(RaptorNode, "raptor_ann", lim.memory_k),
                              select(roots.c.id, roots.c.distance, roots.c.rank.label("o"),
                                     literal(False).label("credited")))
            self.lane_rows.append(self.memory_row(
                "raptor", RaptorNode, pool, text=rn.summary, level=rn.level,
                relation=case((rn.parent_id.is_(None), "root"), else_=null()),
                item_count=func.cardinality(rn.children) + func.cardinality(rn.member_chunk_ids)
                + func.cardinality(rn.member_fact_ids),
                created_at=rn.created_at, updated_at=rn.updated_at))

        if s.working_memory:
            wm = WorkingMemoryItem.__table__.c
            live = wm.expires_at > func.now()
            # RLS shows each user only their own items; the predicate says so for the planner.
            # With a session named, the lane is that session's working memory only.
            mine = and_(wm.user_id == func.auth.user_id(),
                        or_(self.session.is_(None), wm.session_id == self.session))
            pool = self.merge(
                "working_memory", self.ann(WorkingMemoryItem, "working_memory_ann", lim.memory_k,
                                           live, mine),
                ordered(WorkingMemoryItem, live, mine, order=(wm.created_at.desc(), wm.id),
                        k=lim.recent_k, credited=False))
            self.lane_rows.append(self.memory_row(
                "working_memory", WorkingMemoryItem, pool, text=wm.text, author=wm.user_id,
                kind=wm.kind, session_id=wm.session_id, created_at=wm.created_at,
                occurred_at=wm.created_at))

        if s.profiles:
            pr = Profile.__table__.c
            ent = Entity.__table__.alias("profile_subject")
            of_seeds = None
            if seed_ids is not None:
                of_seeds = ordered(Profile, pr.subject_entity_id.in_(seed_ids),
                                   order=(pr.updated_at.desc(), pr.id), k=lim.memory_k,
                                   credited=True)
            pool = self.merge("profiles", self.ann(Profile, "profiles_ann", lim.memory_k), of_seeds)
            row = self.memory_row(
                "profiles", Profile, pool, text=pr.summary,
                subject=func.coalesce(ent.c.canonical_name, pr.subject_user_id),
                created_at=pr.created_at, updated_at=pr.updated_at)
            # The subject is hydrated under the reader's policies, and a profile of an entity
            # the reader cannot read is not served: its summary is titled with the name.
            self.lane_rows.append(row.outerjoin(
                ent, and_(ent.c.tenant_id == tenant, ent.c.id == pr.subject_entity_id))
                .where(or_(pr.subject_entity_id.is_(None), ent.c.id.is_not(None))))

        if s.episodes:
            ep = Episode.__table__.c
            pool = self.merge("episodes", self.ann(Episode, "episodes_ann", lim.memory_k),
                              ordered(Episode, order=(ep.ended_at.desc(), ep.id), k=lim.recent_k,
                                      credited=False))
            self.lane_rows.append(self.memory_row(
                "episodes", Episode, pool, text=ep.summary, author=ep.user_id,
                session_id=ep.session_id, occurred_at=ep.started_at, ended_at=ep.ended_at,
                item_count=ep.turn_count, created_at=ep.created_at))

        if s.observations:
            ob = Observation.__table__.c
            ent = Entity.__table__.alias("observation_subject")
            # The gate of memory.recallable_observations, on the base table so the
            # HNSW scan filters inside the scan.
            pool = self.merge("observations", self.ann(Observation, "observations_ann",
                                                        lim.observation_k,
                                                        ob.confidence >= RECALLABLE_CONFIDENCE))
            row = self.memory_row(
                "observations", Observation, pool, text=ob.text, confidence=ob.confidence,
                perspective_key=ob.perspective_key, subject=ent.c.canonical_name,
                created_at=ob.created_at)
            self.lane_rows.append(row.outerjoin(
                ent, and_(ent.c.tenant_id == tenant, ent.c.id == ob.subject_entity_id)))

        if s.decisions or s.causal:
            dc = Decision.__table__.c
            chosen = self.merge("decisions", self.ann(Decision, "decisions_ann", lim.memory_k))
            decision_cols = {
                "text": dc.embed_text, "kind": dc.category, "outcome": dc.outcome,
                "confidence": dc.confidence, "author": dc.decided_by, "occurred_at": dc.decided_at,
                "created_at": dc.created_at,
            }
            if s.decisions:
                self.lane_rows.append(self.memory_row("decisions", Decision, chosen, **decision_cols))
            if s.causal:
                # The causal links of the chosen decisions, both directions ("to:caused" means
                # the chosen decision caused this one; "from:caused" that this one caused it).
                dl = DecisionLink.__table__.c
                # A linked decision inherits the distance of the decision it is linked to,
                # so it ranks right after it among everything found by meaning.
                out_link = (select(dl.to_decision_id.label("id"), chosen.c.id.label("related_id"),
                                   ("to:" + cast(dl.kind, Text)).label("relation"),
                                   chosen.c.rank.label("seed_rank"), chosen.c.distance)
                            .where(dl.tenant_id == tenant, dl.from_decision_id == chosen.c.id))
                in_link = (select(dl.from_decision_id.label("id"), chosen.c.id.label("related_id"),
                                  ("from:" + cast(dl.kind, Text)).label("relation"),
                                  chosen.c.rank.label("seed_rank"), chosen.c.distance)
                           .where(dl.tenant_id == tenant, dl.to_decision_id == chosen.c.id))
                links = union_all(out_link, in_link).subquery("causal_links")
                order = (links.c.seed_rank, links.c.relation, links.c.id)
                causal = (select(links.c.id, links.c.related_id, links.c.relation, links.c.distance,
                                 literal(True).label("semantic"),
                                 func.row_number().over(order_by=order).label("rank"))
                          .order_by(*order).limit(lim.causal_k).cte("causal_lane"))
                self.lane_rows.append(self.memory_row(
                    "causal", Decision, causal, related_id=causal.c.related_id,
                    relation=causal.c.relation, **decision_cols))

    def merge(self, lane: str, ranked: Any, *more: Select[Any] | None) -> Any:
        """One lane pool: the ANN CTE ``ranked`` (found by meaning) and bounded structural
        lists of ``(id, distance, o, credited)``: found by a seed (credited: the question
        names its entity) or taken as context (the most recent items, the RAPTOR roots: in
        the pool, but ranked by meaning alone). An item found both ways has a row for each,
        so both contributions count."""
        parts = [select(ranked.c.id, ranked.c.distance, ranked.c.rank, literal(True).label("semantic"),
                        literal(False).label("credited"))]
        for n, m in enumerate(more, 1):
            if m is None:
                continue
            sub = m.subquery(f"{lane}_more{n}")
            parts.append(select(sub.c.id, sub.c.distance, sub.c.o.label("rank"),
                                literal(False).label("semantic"), sub.c.credited))
        return (union_all(*parts) if len(parts) > 1 else parts[0]).cte(f"{lane}_lane")

    # -- 7. timeline neighbours --------------------------------------------------------------

    def timeline(self) -> None:
        if not self.shape.timeline or self.source_rows is None:
            return
        lim, tenant = self.lim, self.tenant
        src = self.source_rows
        top = (select(src.c.chunk_id, src.c.document_id, src.c.ordinal, src.c.collection,
                      src.c.occurred_at, src.c.rrf)
               .order_by(src.c.direct.desc(), src.c.rrf.desc(), src.c.chunk_id)
               .limit(lim.timeline_seeds).cte("timeline_seeds"))
        d = Document.__table__.alias("neighbour_doc")
        c = Chunk.__table__.alias("neighbour_chunk")
        seed_rank = func.row_number().over(order_by=(top.c.rrf.desc(), top.c.chunk_id))
        seeds = select(top, seed_rank.label("seed_rank")).subquery("timeline_seed_ranked")

        def neighbour_docs(before: bool) -> Any:
            """The ``timeline_span`` nearest documents in time on one side, ``step`` 1, 2, ..."""
            cmp = d.c.occurred_at < seeds.c.occurred_at if before else d.c.occurred_at > seeds.c.occurred_at
            order = (d.c.occurred_at.desc() if before else d.c.occurred_at.asc(), d.c.id)
            return (select(d.c.id.label("document_id"),
                           func.row_number().over(order_by=order).label("step"))
                    .where(d.c.tenant_id == tenant, d.c.collection == seeds.c.collection,
                           d.c.occurred_at.is_not(None), cmp, _current(d.c))
                    .order_by(*order).limit(lim.timeline_span)
                    .lateral("prev_docs" if before else "next_docs"))

        prev_docs, next_docs = neighbour_docs(True), neighbour_docs(False)
        steps = (func.generate_series(1, lim.timeline_span).table_valued("step")
                 .render_derived(name="timeline_step"))
        dated, undated = seeds.c.occurred_at.is_not(None), seeds.c.occurred_at.is_(None)
        in_time = union_all(
            select(seeds.c.chunk_id.label("related_id"), seeds.c.seed_rank, seeds.c.rrf,
                   literal("previous").label("relation"), prev_docs.c.document_id,
                   literal(0).label("ordinal"), prev_docs.c.step)
            .select_from(seeds.join(prev_docs, true())).where(dated),
            select(seeds.c.chunk_id, seeds.c.seed_rank, seeds.c.rrf, literal("next"),
                   next_docs.c.document_id, literal(0), next_docs.c.step)
            .select_from(seeds.join(next_docs, true())).where(dated),
            select(seeds.c.chunk_id, seeds.c.seed_rank, seeds.c.rrf, literal("before"),
                   seeds.c.document_id, seeds.c.ordinal - steps.c.step, steps.c.step)
            .select_from(seeds.join(steps, true())).where(undated),
            select(seeds.c.chunk_id, seeds.c.seed_rank, seeds.c.rrf, literal("after"),
                   seeds.c.document_id, seeds.c.ordinal + steps.c.step, steps.c.step)
            .select_from(seeds.join(steps, true())).where(undated),
        ).subquery("timeline_links")
        pool = (select(in_time, func.row_number().over(
            order_by=(in_time.c.seed_rank, in_time.c.step, in_time.c.relation)).label("rank"))
            .cte("timeline"))
        joined = (pool.join(c, and_(c.c.tenant_id == tenant, c.c.document_id == pool.c.document_id,
                                    c.c.ordinal == pool.c.ordinal))
                  .join(d, and_(d.c.tenant_id == tenant, d.c.id == pool.c.document_id)))
        self.lane_rows.append(select(*_row(
            lane=literal("timeline"), item_table=literal("sources.chunks"), item_id=c.c.id,
            chunk_id=c.c.id, document_id=d.c.id, ordinal=c.c.ordinal, text=c.c.text,
            char_start=c.c.char_start, char_end=c.c.char_end, section=c.c.section,
            embedding=c.c.embedding,
            direct=literal(False), rrf=literal(0.0), lane_rank=pool.c.rank,
            # A neighbour is context for the evidence it neighbours: a share of that
            # evidence's credit per step away (twice that in timeline mode), so it ranks
            # after it.
            contribution=self.weight("timeline") * pool.c.rrf * func.power(
                bindparam("timeline_share", self.lim.timeline_share, type_=Double),
                cast(pool.c.step, Double)),
            lane_ranks=self.lane_ranks("timeline", pool.c.rank),
            collection=d.c.collection, path=d.c.path, title=d.c.title, kind=d.c.kind,
            state=d.c.state, area=d.c.area, scopes=d.c.scopes, author=d.c.author,
            created_at=d.c.created_at, updated_at=d.c.updated_at, occurred_at=d.c.occurred_at,
            pinned=d.c.pinned, related_id=pool.c.related_id, relation=pool.c.relation,
        )).select_from(joined).where(_current(d.c)))

    # -- 9. catalogs -------------------------------------------------------------------------

    def catalogs(self) -> None:
        if not self.shape.catalogs:
            return
        lim, tenant = self.lim, self.tenant
        d = Document.__table__.c
        # Areas by skipping through ix_documents_tenant_id_area from one area to the next
        # (a loose index scan), never reading every document; each area shows the scope
        # set of one current document in it.
        first = (select(func.min(d.area)).where(d.tenant_id == tenant, d.area.is_not(None), _current(d))
                 .scalar_subquery())
        walk = select(first.label("area"), literal(1).label("n")).cte("area_walk", recursive=True)
        step = walk.alias("area_step")
        following = (select(func.min(d.area)).where(d.tenant_id == tenant, d.area > step.c.area,
                                                    _current(d))
                     .scalar_subquery())
        walk = walk.union_all(select(following, step.c.n + 1)
                              .where(step.c.area.is_not(None), step.c.n < lim.catalog_limit))
        witness = (select(d.scopes, d.updated_at)
                   .where(d.tenant_id == tenant, d.area == walk.c.area, _current(d))
                   .limit(1).lateral("area_witness"))
        areas = (
            select(*_row(lane=literal("area"), text=walk.c.area, area=walk.c.area,
                         scopes=witness.c.scopes, updated_at=witness.c.updated_at))
            .select_from(walk.join(witness, true()))
            .where(walk.c.area.is_not(None))
        )
        projects = (
            select(*_row(
                lane=literal("project"), item_table=literal("sources.documents"), item_id=d.id,
                document_id=d.id, title=d.title, state=d.state,
                area=d.area, kind=d.kind, collection=d.collection, path=d.path,
                scopes=d.scopes, author=d.author, created_at=d.created_at,
                updated_at=d.updated_at, pinned=d.pinned,
            ))
            .where(d.tenant_id == tenant, d.kind == "project", d.state.in_(PROJECT_STATES),
                   _current(d))
            .order_by(d.area.nulls_last(), d.title)
            .limit(lim.catalog_limit)
        )
        self.extra_rows += [select(areas.subquery("area_catalog")),
                            select(projects.subquery("project_catalog"))]

    # -- 8 and 10. item fusion, one union, scope objects -----------------------------------------

    def build(self) -> Select[Any]:
        s = self.shape
        seeds = (self.seeds() if (s.keyed or s.graph or s.communities or s.profiles or s.title)
                 else None)
        self.sources(seeds)
        self.knowledge(seeds)
        self.derived(seeds)
        self.timeline()
        self.catalogs()

        branches: list[Select[Any]] = []
        if self.lane_rows:
            lanes = (union_all(*self.lane_rows) if len(self.lane_rows) > 1
                     else self.lane_rows[0]).cte("lane_rows")
            item = (lanes.c.item_table, lanes.c.item_id)
            # Every lane that found an item, with its rank and score.
            entry = func.jsonb_each(lanes.c.lane_ranks).table_valued("key", "value", name="found")
            found = (select(lanes.c.item_table, lanes.c.item_id,
                            func.jsonb_object_agg(entry.c.key, entry.c.value).label("found_by"))
                     .select_from(lanes.join(entry, true()))
                     .group_by(*item).subquery("item_lanes"))
            # The row that represents an item: a source row first (it carries the fused
            # source ranks), then the best-ranked lane row; its score is the sum of every
            # lane's contribution.
            # Everything found by meaning shares one embedding space, so its rank among all
            # of it (source chunks included) is what an item found by meaning contributes:
            # a summary far from the question ranks below every closer chunk.
            by_meaning = func.rank().over(order_by=lanes.c.semantic_distance.asc().nulls_last())
            scored = select(lanes, func.coalesce(
                lanes.c.contribution,
                lanes.c.weight / (self.rrf_k + cast(by_meaning, Double))).label("credit")
            ).subquery("lane_credit")
            pick = func.row_number().over(
                partition_by=(scored.c.item_table, scored.c.item_id),
                order_by=(case((scored.c.lane == "source", 0), else_=1),
                          scored.c.lane_rank.nulls_first(), scored.c.lane))
            total = func.sum(scored.c.credit).over(partition_by=(scored.c.item_table, scored.c.item_id))
            windowed = select(scored, total.label("rrf_total"), pick.label("pick")).subquery("items")
            cols: list[Any] = []
            for name in COLUMNS:
                if name == "rrf":
                    cols.append(windowed.c.rrf_total.label("rrf"))
                elif name == "lane_ranks":
                    cols.append(found.c.found_by.label("lane_ranks"))
                elif name == "lane":
                    cols.append(case((windowed.c.lane.in_(("source", "timeline")), "source"),
                                     else_=windowed.c.lane).label("lane"))
                else:
                    cols.append(windowed.c[name])
            branches.append(
                select(*cols)
                .select_from(windowed.join(found, and_(found.c.item_table == windowed.c.item_table,
                                                       found.c.item_id == windowed.c.item_id)))
                .where(windowed.c.pick == 1))
        branches += self.extra_rows
        if not branches:
            raise ValueError(f"plan shape {s.name!r} has no lanes")
        union: Select[Any] | CompoundSelect[Any] = (union_all(*branches) if len(branches) > 1
                                                     else branches[0])
        rows = union.subquery("recall_rows")
        sc = Scope.__table__.c
        scope_objects = (
            select(func.coalesce(
                func.jsonb_agg(aggregate_order_by(
                    func.jsonb_build_object("name", sc.name, "description", sc.description), sc.name)),
                cast(literal("[]"), JSONB)))
            .where(sc.id == func.any(rows.c.scopes))
            .scalar_subquery()
        )
        # The active model's generation, read in this statement's own snapshot: the recaller
        # serves the rows only when it embedded the question with that model.
        generation = (select(EmbeddingModel.generation).where(EmbeddingModel.active)
                      .scalar_subquery())
        # The embedding goes out in pgvector's binary form (VectorBytes), not as text.
        out = [func.vector_send(c, type_=VectorBytes()).label(c.name) if c.name == "embedding"
               else c for c in rows.c]
        return select(*out, scope_objects.label("scope_objects"),
                      generation.label(MODEL_GENERATION))


class VectorBytes(TypeDecorator[Any]):
    """A vector sent in pgvector's binary form (``vector_send``: dimension and a reserved
    word as big-endian int16, then big-endian float4s) and read as a float32 array. The
    driver has no loader for ``vector``, so its text form would be parsed in Python: on a
    pool of 150 candidates that took 9 ms of a recall; the bytes take a copy."""

    impl = LargeBinary
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return vector_from_bytes(value)


def vector_from_bytes(value: Any) -> Any:
    """``vector_send``'s bytes as a float32 array (None stays None)."""
    if value is None:
        return None
    dim = int.from_bytes(value[:2], "big")
    return np.frombuffer(value, dtype=">f4", count=dim, offset=4).astype(np.float32)



# The statement's only bind parameters: what changes from one recall to the next.
RUNTIME_PARAMETERS = frozenset({"question", "query_embedding", "mode", "session", "days",
                                "days_end"})


def _inline_constants(stmt: Select[Any]) -> Select[Any]:
    """Render every other value (pool sizes, weights, lane names) as a literal in the SQL.

    A reused (generic) plan is made without the values of bind parameters: a ``LIMIT $1``
    the planner cannot see is estimated as a tenth of the input, which can turn an index
    walk into a sort. With the constants in the text, only the question, its embedding, the
    mode, the session and the days it names are unknown to the plan, and none of them decides
    a plan's shape.
    """
    # Every element once (CTEs are shared by several lanes: a plain walk revisits them).
    seen: set[int] = set()
    stack: list[Any] = [stmt]
    while stack:
        element = stack.pop()
        if id(element) in seen:
            continue
        seen.add(id(element))
        if isinstance(element, BindParameter) and element.key not in RUNTIME_PARAMETERS:
            element.literal_execute = True
        stack.extend(element.get_children())
    return stmt


_DIALECT = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]


def runtime_sql(stmt: Select[Any]) -> str:
    """``stmt`` as the driver receives it (psycopg's ``%(name)s`` placeholders): every constant
    in the text, only the runtime parameters left. Recall sends this text as it is, so
    SQLAlchemy does not re-render the ninety-kilobyte statement's literals on every call and
    psycopg finds its prepared statement by the same text each time."""
    compiled = stmt.compile(dialect=_DIALECT)
    return compiled.construct_expanded_state(
        {name: None for name in RUNTIME_PARAMETERS if name in compiled.binds}).statement


def build_recall_statement(shape: PlanShape = FULL_PLAN,
                           limits: StatementLimits | None = None,
                           index_tier: str = "pgvector", *,
                           size_class: int | None = None,
                           own_index: uuid.UUID | None = None) -> Select[Any]:
    """The recall statement for ``shape``; parameters ``question``, ``query_embedding``, ``mode``,
    ``session``, ``days`` and ``days_end`` (``recall.dates.day_bounds``); every other value is a
    literal in its text.

    Production passes ``FULL_PLAN``, the installation's index tier (``engram.installation``)
    and the caller's tenant size class (``recall.plan_cache``): the class is a comment in the
    text, so each class is its own prepared statement with its own reused plan. Other shapes
    exist for the plan study. ``own_index``: the caller's tenant id when it has its own
    vector indexes (``plans.TenantSize``), named in every vector lane (``_Builder.own``).
    """
    lim = limits or StatementLimits.from_settings(get_settings())
    stmt = _Builder(shape, lim, index_tier, own_index).build()
    if size_class is not None:
        stmt = stmt.prefix_with(size_class_comment(shape, size_class, own_index))
    return _inline_constants(stmt)


def size_class_comment(shape: PlanShape, size_class: int,
                       own_index: uuid.UUID | None = None) -> str:
    """What makes the statement's text, and so its prepared statement, one per size class
    (and one per tenant with its own vector index)."""
    own = "" if own_index is None else f", own vector index of tenant {own_index}"
    return f"/* engram recall {shape.name}, tenant size class {size_class}{own} */"
