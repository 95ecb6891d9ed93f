"""``recall``: embed, one statement under the caller's identity, the Python tail, render.

A ``Recaller`` holds what a process shares between recalls: the application
engine (``engram_app``, never an owner or superuser), settings, the embedder
and the reranker. ``recall`` takes a verified ``Identity`` and never a list of
scopes: the identity is bound to the one transaction the statement runs in,
and forced row level security is the whole visibility boundary.

The production path always builds ``FULL_PLAN``; ``Recaller.study`` runs a
narrower shape for the plan study and is not reachable from ``recall``.

The embedding model is checked on every recall at no extra round trip: the
recaller embeds the question with the model it believes active
(``active_model``, read once per process and after every change), and the
statement returns the active generation read in its own snapshot. When they
differ (``engram models activate`` ran), the rows are dropped unserved, the
recaller loads the new model and runs the recall again; a process that cannot
load it refuses with ``MODEL_MISMATCH``. A question embedded by one model is
never ranked against another model's vectors.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
from sqlalchemy import Connection, CursorResult, Engine, event, func, select, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import QueuePool

from orchestrator.auth import Identity
from orchestrator.config import Settings, get_settings
from orchestrator.db.models import Installation
from orchestrator.db.session import bound_session, prepared_at_once
from orchestrator.errors import BadInput, EngramError
from orchestrator.inputs import text_problem
from orchestrator.recall.access import AccessCounts, UsageRows
from orchestrator.recall.dates import day_bounds, named_days
from orchestrator.recall.excerpt import fit_next, least_budget
from orchestrator.recall.features import RankContext
from orchestrator.recall.mmr import diversify
from orchestrator.recall.plan import FULL_PLAN, PlanShape
from orchestrator.recall.plans import (
    MAX_CLASS,
    TenantSizes,
    size_class,
    tenant_size,
    transaction_settings,
)
from orchestrator.recall.prepare import PreparedMemory, build_bundle
from orchestrator.recall.query_cache import QueryEmbeddingCache, model_key
from orchestrator.recall.ranker import RankModel, apply_learned, single_threaded_blas
from orchestrator.recall.render import render, render_prefixes
from orchestrator.recall.result import RecallResult, Served, SourceRef
from orchestrator.recall.statement import (
    MODEL_GENERATION,
    MODES,
    StatementLimits,
    build_recall_statement,
    runtime_sql,
    size_class_comment,
    vector_from_bytes,
)
from orchestrator.recall.tail import (
    CLAIMS,
    ITEM_KINDS,
    Candidate,
    apply_precedence,
    assign_merit,
    boost_named_days,
    budget_cut,
    candidates_from_rows,
    discount_deprecated,
    discount_navigation,
    keep_direct_best,
    named_catalogs,
    narrower_subjects,
    order,
    served_once,
    stable_key,
    token_cost,
    trim_overlaps,
    unfound_subjects,
)
from orchestrator.recall.trace import Trace, item
from orchestrator.worker.registry import ActiveModel, ModelMismatch, read_active

if TYPE_CHECKING:
    from orchestrator.audit.chainer import ReceiptChainer

MAX_ASKER_CHARS = 200
# memory.working_memory.session_id's length check (0005).
MAX_SESSION_CHARS = 200
R = TypeVar("R", bound=Served)
# Recalls run again at most this many times when the active model changes under them.
MODEL_ATTEMPTS = 3
# The trace's pools, in the statement's order: lane -> the rank key its items carry.
POOLS = {lane: f"{lane}_rank" for lane in (
    "dense", "lexical", "title", "facts", "keyed", "graph", "communities", "raptor",
    "working_memory", "profiles", "episodes", "observations", "decisions", "causal", "timeline")}


class QueryEmbedder(Protocol):
    def embed_query(self, question: str, asker: str | None = None) -> Any: ...


class CrossEncoder(Protocol):
    @property
    def available(self) -> bool: ...

    def score(self, query: str, passages: Sequence[str]) -> list[float]: ...


@dataclass(frozen=True)
class RecallRequest:
    question: str
    asker: str | None
    budget_tokens: int
    mode: str | None
    session: str | None = None


def validate(question: Any, asker: Any, budget_tokens: Any, mode: Any,
             settings: Settings, session: Any = None) -> RecallRequest:
    """Refuse bad input with one message naming every problem."""
    problems = []
    if not isinstance(question, str):
        problems.append(f"the question must be text, not {type(question).__name__}")
    elif not question.strip():
        problems.append("the question is empty")
    elif len(question) > settings.recall_max_question_chars:
        problems.append(f"the question is {len(question)} characters; the limit is "
                        f"{settings.recall_max_question_chars}")
    elif text_problem(question):
        problems.append(f"the question {text_problem(question)}")
    if asker is not None and (not isinstance(asker, str) or len(asker) > MAX_ASKER_CHARS):
        problems.append(f"asker must be text of at most {MAX_ASKER_CHARS} characters")
    elif isinstance(asker, str) and text_problem(asker):
        problems.append(f"asker {text_problem(asker)}")
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int):
        problems.append(f"budget_tokens must be an integer, not {type(budget_tokens).__name__}")
    elif budget_tokens <= 0:
        problems.append(f"budget_tokens must be positive, not {budget_tokens}")
    elif budget_tokens > settings.recall_max_budget_tokens:
        problems.append(f"budget_tokens {budget_tokens} is above the limit of "
                        f"{settings.recall_max_budget_tokens}")
    if mode is not None and mode not in MODES:
        problems.append(f"unknown mode {mode!r}; use one of {', '.join(MODES)} or none")
    if session is not None and (not isinstance(session, str) or not session.strip()
                                or len(session) > MAX_SESSION_CHARS):
        problems.append(f"session must be non-empty text of at most {MAX_SESSION_CHARS} characters")
    elif isinstance(session, str) and text_problem(session):
        problems.append(f"session {text_problem(session)}")
    if problems:
        raise BadInput("invalid recall: " + "; ".join(problems))
    assert isinstance(question, str)
    return RecallRequest(question.strip(), (asker or "").strip() or None, budget_tokens, mode,
                         session.strip() if isinstance(session, str) else None)


@contextmanager
def count_statements(target: Engine | Connection) -> Iterator[list[str]]:
    """Collect every statement sent while the block runs: by the whole engine, or by one
    connection only (what a recall counts, so concurrent recalls never add to its count)."""
    seen: list[str] = []

    def listener(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(target, "before_cursor_execute", listener)
    try:
        yield seen
    finally:
        event.remove(target, "before_cursor_execute", listener)


class _ModelChanged(Exception):
    """The statement saw another active model than the question was embedded with."""


class Recaller:
    """``embedder``: a fixed query embedder (tests, benchmarks); without one, the recaller
    embeds with whichever model is active and follows every change."""

    def __init__(self, engine: Engine, settings: Settings | None = None, *,
                 embedder: QueryEmbedder | None = None,
                 reranker: CrossEncoder | None = None, index_tier: str | None = None,
                 ranker: RankModel | str | None = None) -> None:
        """``ranker``: a fixed model (or the reason there is none) for every tenant, as an
        evaluation passes; unset, each tenant's active model, else the packaged default.
        An evaluation that only replays traces (``replay``, a model per fold) may pass None
        for ``engine``: whatever needs the database then says it has none."""
        from orchestrator.recall.learning import ModelChooser

        self.engine = engine
        self.settings = settings or get_settings()
        self._embedder = embedder
        self._reranker = reranker
        self.models = ModelChooser(self.settings, fixed=ranker)
        # Evaluation: keep each recall's candidates in its trace, for ``replay``.
        self.keep_candidates = False
        self._index_tier = index_tier
        self._statements: dict[tuple[str, int | None, uuid.UUID | None], Any] = {}
        self._sql: dict[tuple[str, int | None, uuid.UUID | None], str] = {}
        self.sizes = TenantSizes(self.settings.recall_size_ttl_s)
        self.query_cache = QueryEmbeddingCache(self.settings.recall_query_cache_size)

        self._active: ActiveModel | None = None
        self._services: dict[str, QueryEmbedder] = {}
        self.warmed = False

    @property
    def chainer(self) -> ReceiptChainer:
        """The background thread (one per engine in the process) that bumps the served
        facts' access counters, writes the usage rows and appends the queued receipts to the
        chain, moments after each recall. Looked up on each use: after the engine is
        disposed, the next recall starts a new one."""
        return self._background().chainer

    @property
    def access(self) -> AccessCounts:
        """The served facts' access counts, applied by ``chainer``'s thread."""
        return self._background().access

    @property
    def usage(self) -> UsageRows:
        """The usage rows of recalls and prepares, written by ``chainer``'s thread."""
        return self._background().usage

    def _background(self) -> _Background:
        if self.engine is None:
            raise BadInput("this recaller has no database: it only replays traces")
        return _background(self.engine, self.settings)

    def settle(self) -> int:
        """Apply the pending access counts, write the queued usage rows and chain every
        queued receipt now (an auditor about to verify a receipt this process just wrote, a
        test); returns how many receipts were chained."""
        return int(self.chainer.flush())

    @property
    def active_model(self) -> ActiveModel:
        """The model questions are embedded with now; ``key`` names it and its activation
        (what a cache of query embeddings keys by)."""
        if self._active is None:
            return self.refresh_model()
        return self._active

    def refresh_model(self) -> ActiveModel:
        """Read the registry again (after a recall saw another generation)."""
        with self.engine.begin() as conn:  # committed: a ROLLBACK drops the prepared statements
            self._active = read_active(conn)
        return self._active

    def query_embedder(self, model: ActiveModel) -> QueryEmbedder:
        """The embedder for ``model``; ``ModelMismatch`` when this recaller cannot have it."""
        if self._embedder is not None:
            fixed = getattr(self._embedder, "model_name", None)
            if fixed is not None and fixed != model.name:
                raise ModelMismatch(f"the active embedding model is {model.describe()}, but this "
                                    f"recaller was built with {fixed}")
            return self._embedder
        found = self._services.get(model.key)
        if found is None:
            from orchestrator.worker.service import model_service_for

            # Found once per activation: locating a model reads the disk.
            found = self._services[model.key] = model_service_for(self.settings, model)
        return found

    def warm_up(self) -> dict[str, float]:
        """Load the models and run each stage of a recall once, so that the first recall
        after this costs what later ones do; returns milliseconds per stage.

        The statement's text is compiled (about 100 ms for SQLAlchemy), and the plans of the
        small size classes are made on the first ``recall_warm_plan_connections`` pooled
        connections (``_warm_plans``), where a first recall's other reads are made too
        (``_warm_reads``). The query model runs twice (its first call is much slower than
        the second)."""
        laps: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(stage: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            laps[stage] = (now - clock) * 1000.0
            clock = now

        embedder = self.embedder
        vector = embedder.embed_query("warm up the query model", None)
        embedder.embed_query("and once more, warm", "engram")
        lap("models")
        if self.reranker.available:
            self.reranker.score("warm up", ["the cross-encoder"])
        lap("reranker")
        s = self.settings
        classes = range(min(s.recall_warm_plan_classes, MAX_CLASS + 1) if s.recall_plan_reuse else 0)
        # The texts first: compiling reads the index tier through a connection of its own,
        # which would come back to the pool past the held ones and push a warmed one out.
        texts = {k: self.sql(FULL_PLAN, k) for k in (classes or [0])}
        pooled = self.engine.pool.size() if isinstance(self.engine.pool, QueuePool) else 1
        with ExitStack() as held:  # the connections at once, so each is a different one
            conns = [held.enter_context(self.engine.connect()) for _ in
                     range(max(1, min(pooled, s.recall_warm_plan_connections)))]
            for conn in conns:
                self._warm_plans(conn, texts, vector, prepare=bool(classes))
            lap("statement")
            for conn in conns:
                self._warm_reads(conn)
        self._background()  # the thread that writes usage rows and chains receipts
        lap("reads")
        candidates_from_rows([], catalog_rrf=0.0)
        render("warm up", [])
        lap("tail")
        if self.settings.recall_learned:
            self._warm_ranker(vector)
        lap("ranker")
        self.warmed = True
        return laps

    def _warm_plans(self, conn: Connection, texts: dict[int, str], vector: Any,
                    prepare: bool) -> None:
        """The recall statement (``texts``: the text recall sends for each size class,
        compiled once) run on one of the first ``recall_warm_plan_connections`` connections
        of the pool (it hands out the one returned last, so these serve the first recalls
        and every recall at light load), in a transaction bound to a tenant id that no
        tenant has and to no scope, so row level security shows it nothing: it reads no row
        and writes nothing. With ``prepare`` (plan reuse on; ``warm_up`` gives the classes
        below ``recall_warm_plan_classes``) each text runs prepared, and its generic plan
        stays on the connection (the transaction commits: a rollback would make psycopg
        drop its prepared statements), so a small tenant's first recall reuses it instead of
        planning (40-60 ms of a 10-20 ms recall); without, class 0's runs unprepared (it
        loads the catalog entries a recall needs). Only small classes: the planner estimates
        a generic plan's rows with the tenant bound when it plans, and a tenant no
        statistics know stands for a small one; measured on the kept 10k corpus
        (docs/recall.md), a plan made so ran as fast as one made for the tenant itself for
        tenants of 10 and 48 chunks, but 2-3x slower for 500 and 3,000 (and a plan made for
        no tenant at all, one row expected everywhere, ran nested loops that took 4-9 s on
        3,000 chunks). A larger tenant's class is planned by its first recall on each
        connection."""
        params = {"question": "warm up", "query_embedding": vector_text(vector), "mode": None,
                  "session": None, **day_bounds(())}
        with conn.begin():
            conn.execute(select(func.set_config("engram.tenant_id", str(uuid.uuid4()), True)))
            for k, sql in texts.items():
                if not prepare:
                    conn.exec_driver_sql(sql, params).all()
                    continue
                conn.execute(select(*(func.set_config(name, value, True) for name, value
                                      in transaction_settings(10 ** k, self.settings).items())))
                with prepared_at_once(conn):
                    conn.exec_driver_sql(sql, params).all()

    def _warm_reads(self, conn: Connection) -> None:
        """What a tenant's first recall reads besides the statement, on one warmed
        connection with no identity bound (row level security shows nothing, so nothing is
        cached for anyone): its size class, its own ranking model, and the receipt seal's
        query of served row versions, every branch (its plan is made at its first call on a
        connection). Their first calls compile statements and load catalog entries, about
        5-10 ms of a first recall."""
        nobody = json.dumps({table: [str(uuid.uuid4())] for table in ITEM_KINDS})
        with conn.begin(), Session(bind=conn) as session:
            tenant_size(session)
            self.models.stored(session)
            conn.execute(text("select count(*) from provenance.served_row_versions("
                              "cast(:ids as jsonb), null::uuid)"), {"ids": nobody})

    def _warm_ranker(self, vector: Any) -> None:
        """The ranking tail once over two made-up candidates: loads the ranker model (importing
        LightGBM alone takes most of a second) and runs PPR, the features, one predict and MMR
        (their first calls compile patterns and fill caches). A tenant's own model is read on
        its first recall, as before."""
        model = self.models.without_tenant()
        pool = [Candidate(key=f"warm:{i}", kind="source", text=sentence, scopes=(),
                          source=SourceRef("warm-up", f"w{i}", f"w{i}"), embedding=vector,
                          lanes={"dense_rank": i + 1, "dense_distance": 0.5}, rrf=1.0 / (61 + i))
                for i, sentence in enumerate(("Ada met Bob in London.", "Bob moved to Lisbon."))]
        with single_threaded_blas():
            apply_learned(pool, RankContext("Where did Ada meet Bob?", None, vector, ["Ada", "Bob"]),
                          model)
            assign_merit(pool, self.settings.recall_pin_boost)
            diversify(order(pool), self.settings.recall_mmr_lambda, self.settings.recall_mmr_doc_cap,
                      self.settings.recall_mmr_depth, self.settings.recall_mmr_cap_discount)

    @property
    def index_tier(self) -> str:
        """The installation's index tier (``engram.installation``), read once."""
        if self._index_tier is None:
            with self.engine.begin() as conn:
                tier = conn.execute(select(Installation.value)
                                    .where(Installation.key == "index_tier")).scalar()
            self._index_tier = tier or "pgvector"
        return self._index_tier

    @property
    def embedder(self) -> QueryEmbedder:
        """The query embedder of the active model: models in this process, or the served
        worker when ENGRAM_WORKER_URL is set."""
        return self.query_embedder(self.active_model)

    @property
    def reranker(self) -> CrossEncoder:
        if self._reranker is None:
            from orchestrator.worker.service import model_service

            self._reranker = _ServiceReranker(model_service(self.settings))
        return self._reranker

    def statement(self, shape: PlanShape, size: int | None = None,
                  own_index: uuid.UUID | None = None) -> Any:
        """The statement of ``shape`` for a tenant size class (``plans.size_class``), built
        once per recaller; ``size`` None gives the text without a class; ``own_index`` the
        text for a tenant with its own vector index (``plans.TenantSize``)."""
        key = (shape.name, size, own_index)
        stmt = self._statements.get(key)
        if stmt is None:
            stmt = build_recall_statement(shape, StatementLimits.from_settings(self.settings),
                                          self.index_tier, size_class=size, own_index=own_index)
            self._statements[key] = stmt
        return stmt

    def sql(self, shape: PlanShape, size: int | None, own_index: uuid.UUID | None = None) -> str:
        """The driver's text of the statement of ``shape`` for size class ``size``
        (``statement.runtime_sql``): the class-less text, compiled once per shape (compiling
        the ninety-kilobyte statement takes about 100 ms) and once per tenant with its own
        vector index, behind the class's comment."""
        key = (shape.name, size, own_index)
        found = self._sql.get(key)
        if found is None:
            if size is None:
                found = runtime_sql(self.statement(shape, own_index=own_index))
            else:
                found = (f"{size_class_comment(shape, size, own_index)} "
                         f"{self.sql(shape, None, own_index)}")
            self._sql[key] = found
        return found

    def query_vector(self, identity: Identity, question: str, asker: str | None,
                     model: ActiveModel | None = None) -> tuple[Any, bool]:
        """The embedding of ``asker: question`` by ``model`` (default: the active one) and
        whether it was cached (per tenant and model activation: ``query_cache``)."""
        model = model or self.active_model
        embedder = self.query_embedder(model)
        # The activation (name@generation) and the weights' version behind the embedder.
        return self.query_cache.get_or_embed(
            identity.org_id, (model.key, model_key(embedder)[1]), question, asker,
            lambda: embedder.embed_query(question, asker))

    def recall(self, identity: Identity, question: str, asker: str | None = None,
               budget_tokens: int | None = None, mode: str | None = None,
               session: str | None = None, channel: str = "python") -> RecallResult:
        """``session`` names the asker's current working-memory session: the working-memory
        lane reads that session only (every unexpired item of the user when it is None).
        ``channel`` is what the usage row records (graphql, mcp, python, cli)."""
        return self._run(identity, question, asker, budget_tokens, mode, FULL_PLAN, self._cut,
                         session, channel, detail=False)[0]

    def trace(self, identity: Identity, question: str, asker: str | None = None,
              budget_tokens: int | None = None, mode: str | None = None,
              session: str | None = None, channel: str = "python", *,
              detail: bool = True) -> tuple[RecallResult, Trace]:
        """The recall and its trace; ``detail`` False leaves out what only a trace reader
        needs (pools, fused and ordered lists): ``recall``'s cost, with the trace's summary
        (timings, the embedding model, the receipt)."""
        return self._run(identity, question, asker, budget_tokens, mode, FULL_PLAN, self._cut,
                         session, channel, detail=detail)

    def prepare(self, identity: Identity, question: str, asker: str | None = None,
                budget_tokens: int | None = None, mode: str | None = None,
                session: str | None = None, channel: str = "python"
                ) -> tuple[PreparedMemory, Trace]:
        """``memory_prepare``: the same statement and tail, cut into one bundle under one budget."""
        settings = self.settings

        def finish(req: RecallRequest, ordered: list[Candidate], trace: Trace) -> PreparedMemory:
            return build_bundle(req.question, req.asker, req.budget_tokens, ordered, trace,
                                settings.recall_chars_per_token)

        return self._run(identity, question, asker, budget_tokens, mode, FULL_PLAN, finish, session,
                         channel, "prepare", detail=False)

    def study(self, identity: Identity, question: str, shape: PlanShape, asker: str | None = None,
              budget_tokens: int | None = None, mode: str | None = None,
              session: str | None = None) -> tuple[RecallResult, Trace]:
        """Evaluation only: run a plan-study shape through the same builder and tail."""
        return self._run(identity, question, asker, budget_tokens, mode, shape, self._cut, session)

    def _cut(self, req: RecallRequest, ordered: list[Candidate], trace: Trace) -> RecallResult:
        """Recall's end: the longest prefix of the order whose rendering fits the budget,
        and the item after it cut to the part that fits the room left (``recall.excerpt``)."""
        evidence = trim_overlaps([c.evidence() for c in ordered])
        cpt = self.settings.recall_chars_per_token
        prefixes = render_prefixes(req.question, evidence)
        kept, rendered, used = budget_cut(evidence, req.budget_tokens, cpt, lambda _: prefixes)
        fitted = fit_next(req.question, evidence, kept, req.budget_tokens, cpt, used, prefixes)
        if fitted is not None:
            part, rendered, used = fitted
            trace.clipped = (len(part.text), len(evidence[kept].text))
            evidence[kept] = part
            kept += 1
        trace.kept, trace.used_tokens = kept, used
        if not kept and evidence:
            # Evidence matched and none of it fits: say what budget would serve the first.
            whole = token_cost(prefixes(1), cpt)

            def serves(budget: int) -> bool:
                return whole <= budget or fit_next(req.question, evidence, 0, budget, cpt, used,
                                                   prefixes) is not None

            trace.needed_tokens = least_budget(serves, req.budget_tokens, whole)
        return RecallResult(req.question, req.asker, req.budget_tokens, used,
                            tuple(evidence[:kept]), rendered, trace.needed_tokens)

    def _run(self, identity: Identity, question: str, asker: str | None,
             budget_tokens: int | None, mode: str | None, shape: PlanShape,
             finish: Callable[[RecallRequest, list[Candidate], Trace], R],
             session_id: str | None = None, channel: str = "python",
             operation: str = "recall", *, detail: bool = True) -> tuple[R, Trace]:
        """One recall; ``detail`` False skips what only the trace shows (pools, fused and
        ordered lists), which ``recall`` and ``prepare`` do not return."""
        s = self.settings
        req = validate(question, asker,
                       s.recall_budget_tokens if budget_tokens is None else budget_tokens, mode, s,
                       session_id)
        trace = Trace(req.question, req.asker, shape.name, req.mode, req.budget_tokens,
                      session=req.session)
        clock = time.perf_counter()

        def lap(stage: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            trace.timings_ms[stage] = (now - clock) * 1000.0
            clock = now

        for _ in range(MODEL_ATTEMPTS):
            model = self.active_model
            vector, trace.embedding_cached = self.query_vector(identity, req.question, req.asker,
                                                               model)
            lap("embed")
            try:
                result = self._serve(identity, req, shape, finish, trace, vector, model, lap,
                                     channel, operation, detail)
            except _ModelChanged:
                self.refresh_model()
                continue
            except EngramError as exc:
                # A flip to another dimension retypes the columns: the statement fails on the
                # old dimension instead of returning rows. Anything else is the caller's.
                if exc.sqlstate is None or self.refresh_model().generation == model.generation:
                    raise
                continue
            return result, trace
        raise ModelMismatch(f"the active embedding model changed {MODEL_ATTEMPTS} times during "
                            "one recall; ask again")

    def _serve(self, identity: Identity, req: RecallRequest, shape: PlanShape,
               finish: Callable[[RecallRequest, list[Candidate], Trace], R], trace: Trace,
               vector: Any, model: ActiveModel, lap: Callable[[str], None], channel: str,
               operation: str, detail: bool) -> R:
        s = self.settings
        size = self.sizes.entry(identity.org_id)
        usage: dict[str, Any] | None = None
        days = named_days(req.question)  # the statement's dated subjects and the tail's boost
        with bound_session(self.engine, identity,
                           settings=None if size is None else transaction_settings(size, s)
                           ) as session:
            connection = session.connection()
            with count_statements(connection) as sent:
                if size is None:
                    # Once per tenant and recall_size_ttl_s: the class picks the plan.
                    size = tenant_size(session)
                    self.sizes.put(identity.org_id, size)
                    session.execute(select(*(func.set_config(name, value, True) for name, value
                                             in transaction_settings(size, s).items())))
                klass = size_class(size.chunks)
                own = ("" if size.own_index is None else
                       ", the vector lanes over the tenant's own vector indexes")
                trace.plan_note = (f"tenant size class {klass} ({size.chunks} visible chunks in "
                                   f"the statistics){own}, "
                                   + ("reused plan" if s.recall_plan_reuse
                                      else "planned for this call"))
                if days:
                    trace.plan_note += ("; the question names the day(s) "
                                        + ", ".join(f"{d:%Y-%m-%d}" for d in days)
                                        + ": documents dated them are subjects it names")
                with prepared_at_once(connection):
                    rows = _loaded(connection.exec_driver_sql(
                        self.sql(shape, klass, size.own_index),
                        {"question": req.question, "query_embedding": vector_text(vector),
                         "mode": req.mode, "session": req.session, **day_bounds(days)}))
            if rows and rows[0][MODEL_GENERATION] != model.generation:
                raise _ModelChanged()
            trace.statements = len(sent)
            trace.embedding_model = model.key
            lap("statement")

            catalog_rrf = 1.0 / (s.recall_rrf_k + s.recall_catalog_rank)
            candidates, trace.corpus = candidates_from_rows(rows, catalog_rrf=catalog_rrf)
            trace.hydration_dropped = trace.corpus.pop("hydration_dropped", [])
            if detail:
                for lane, rank_key in POOLS.items():
                    pool = sorted((c for c in candidates if rank_key in c.lanes),
                                  key=lambda c, k=rank_key: (c.lanes[k], stable_key(c)))  # type: ignore[misc]
                    if pool or getattr(shape, lane):
                        trace.pools[lane] = [item(c) for c in pool]
                for kind in ("area_catalog", "project_catalog"):
                    trace.pools[kind] = [item(c) for c in candidates if c.kind == kind]
            lap("hydrate")

            if self.keep_candidates:
                # Shallow copies: the tail changes only scalar fields (merit, scores, bits).
                trace.replay = (req, vector, [copy.copy(c) for c in candidates])
            ordered = self._order(session, identity.org_id, req, vector, candidates, shape, trace,
                                  lap, detail, days=days)

            result = finish(req, ordered, trace)
            lap("budget_render")
            with count_statements(connection) as sent:
                self._side_effects(session, identity, result, trace)
            trace.side_effect_statements = len(sent)
            if trace.receipt_id is not None:  # the caller's handle on what it was served
                result = replace(result, receipt_id=trace.receipt_id)
            if s.rank_usage_rows:
                from orchestrator.recall.learning import usage_params

                usage = usage_params(
                    operation=operation, channel=channel, question=req.question,
                    report=trace.ranking, served=result.served_rows(), pooled=ordered,
                    model_id=trace.model_id, receipt_id=trace.receipt_id,
                    pooled_limit=s.rank_usage_pooled)
        if usage is not None:
            self.usage.add(identity, usage)  # committed: the receipt it names exists
            trace.usage_rows = 1 + len(usage["served_ids"])
        if trace.receipt_id is not None or trace.touched_claims or trace.usage_rows:
            self.chainer.wake()  # committed: counts, usage and chain event wait for the background
        lap("side_effects")
        return result

    def _side_effects(self, session: Any, identity: Identity, result: Served,
                      trace: Trace) -> None:
        """The recall's receipt, sealed here (its chain event queued: migration 0040), and
        the access counts of the facts actually served, applied in the background
        (``recall.access``)."""
        served = result.served_rows()
        served_claims = sorted({i for t, i in served if t == CLAIMS}, key=str)
        if served_claims:
            self.access.add(identity, served_claims)
            trace.touched_claims = len(served_claims)
        if self.settings.recall_receipts and served:
            from orchestrator.audit.receipts import append_served

            trace.receipt_id = append_served(session, result.question, served, result.rendered)

    def _order(self, session: Any, org: str, req: RecallRequest, vector: Any,
               candidates: list[Candidate], shape: PlanShape, trace: Trace,
               lap: Callable[[str], None], detail: bool = True,
               days: Sequence[datetime] = ()) -> list[Candidate]:
        """The tail's ranking: cross-encoder, learned ranker, merit, precedence, the
        identity-aware order, duplicates, redundant derived items, MMR. ``days``: the days the
        question names (``recall.dates.named_days``), read once per recall."""
        s = self.settings
        trace.narrower = narrower_subjects(req.question, candidates)
        if shape.dense and shape.lexical:
            trace.unfound = unfound_subjects(req.question, candidates)
        self._rerank(req.question, candidates, shape, trace)
        lap("rerank")
        with single_threaded_blas():
            self._learn(session, org, req, vector, candidates, shape, trace)
            lap("ranker")
            assign_merit(candidates, s.recall_pin_boost)
            if dated := boost_named_days(candidates, days, s.recall_day_boost):
                trace.named_day = (f"{dated} item(s) from a day the question names, merit "
                                   f"+{s.recall_day_boost:g}")
            if navigation := discount_navigation(candidates, s.recall_navigation_discount):
                trace.navigation = (f"{navigation} chunk(s) a table of contents or a list of "
                                    f"links, at {s.recall_navigation_discount:g} of their merit")
            if old := discount_deprecated(req.question, candidates, s.recall_deprecated_discount):
                trace.deprecated = (f"{old} chunk(s) with a deprecation notice, at "
                                    f"{s.recall_deprecated_discount:g} of their merit")
            if detail:
                trace.fused = [item(c) for c in sorted(candidates, key=lambda c: (-c.rrf, stable_key(c)))]
            candidates, trace.precedence = apply_precedence(candidates)
            trace.direct_lost = len(keep_direct_best(candidates, s.recall_title_chunks,
                                                        s.recall_navigation_discount < 1.0))
            # After the ranker: its features know no catalog, and the bit is the question's.
            trace.catalogs = named_catalogs(req.question, candidates)
            ordered, redundant, dropped = served_once(order(candidates),
                                                      s.recall_duplicate_similarity)
            if redundant and detail:  # the trace names them as its other lines do, by label
                named = {k for key, holder, _ in redundant for k in (key, holder)}
                labels = {c.key: item(c).named for c in candidates if c.key in named}
                trace.redundant = [(labels.get(key, key), labels.get(holder, holder), raised)
                                   for key, holder, raised in redundant]
            if s.recall_diverse:
                started = time.perf_counter()
                ordered, deferred = diversify(ordered, s.recall_mmr_lambda, s.recall_mmr_doc_cap,
                                              s.recall_mmr_depth, s.recall_mmr_cap_discount)
                trace.timings_ms["mmr"] = (time.perf_counter() - started) * 1000.0
                trace.diversity = (f"MMR lambda {s.recall_mmr_lambda}, at most "
                                   f"{s.recall_mmr_doc_cap} chunk(s) per document before the "
                                   f"rest compete at {s.recall_mmr_cap_discount:g} of their merit; "
                                   f"{len(deferred)} deferred by the cap")
            else:
                trace.diversity = "off (recall_diverse); merit order"
        if detail:
            trace.ordered = [item(c) for c in ordered]
            trace.suppressed = [(item(a).named, item(b).named, sim) for a, b, sim in dropped]
        lap("order")
        return ordered

    def replay(self, trace: Trace, shape: PlanShape) -> tuple[RecallResult, Trace]:
        """Evaluation only: the tail and the budget cut again over the candidates a recall's
        statement returned (kept in ``trace.replay`` when ``keep_candidates`` is set), with
        this recaller's ranker and settings. The statement's rows do not depend on the
        ranker, so this is the recall this recaller would serve, without running the
        statement again (cross-validation trains a model per fold after the recalls)."""
        if trace.replay is None:
            raise BadInput("this trace kept no candidates (Recaller.keep_candidates was off)")
        req, vector, kept = trace.replay
        again = Trace(req.question, req.asker, shape.name, req.mode, req.budget_tokens,
                      session=req.session, corpus=dict(trace.corpus))
        candidates = [copy.copy(c) for c in kept]
        ordered = self._order(None, "", req, vector, candidates, shape, again, lambda _: None,
                              days=named_days(req.question))
        return self._cut(req, ordered, again), again

    def _learn(self, session: Any, org: str, req: RecallRequest, vector: Any,
               candidates: list[Candidate], shape: PlanShape, trace: Trace) -> None:
        """The learned ranker's scores (``c.learned``), unless the shape, the settings or a
        cross-encoder that already scored the pool say otherwise; the trace says which."""
        ctx = RankContext(req.question, req.asker, vector, list(trace.corpus.get("seeds") or ()))
        refused: str | None = None
        if any(c.rerank is not None for c in candidates):
            model: RankModel | str | None = "the cross-encoder orders the candidates"
        elif not shape.learned:
            model = f"off in plan shape {shape.name}"
        elif not self.settings.recall_learned:
            model = "off (recall_learned)"
        else:
            model, trace.model_id, refused = self.models.model_for(session, org)
        report = apply_learned(candidates, ctx, model)
        if refused:
            report.note = f"{refused}; {report.note}"
        trace.ranker, trace.ppr, trace.ranking = report.note, report.ppr, report
        for stage, ms in (report.timings_ms or {}).items():
            trace.timings_ms[f"ranker.{stage}"] = ms

    def _rerank(self, question: str, candidates: list[Candidate], shape: PlanShape,
                trace: Trace) -> None:
        if not shape.rerank:
            trace.reranker = f"off in plan shape {shape.name}; fused order is used"
            return
        reranker = self.reranker
        if not reranker.available:
            note = getattr(reranker, "note", None) or "no cross-encoder is available"
            trace.reranker = f"unavailable ({note})"
            return
        # The reranker sees the complete chunk text, never a truncated one; the
        # pool it scores is the best fused candidates plus every direct subject.
        pool = sorted(candidates, key=lambda c: (not c.direct, -c.rrf, stable_key(c)))
        pool = pool[: max(self.settings.recall_rerank_candidates,
                          sum(1 for c in candidates if c.direct))]
        if not pool:
            trace.reranker = "nothing to rerank"
            return
        scores = reranker.score(question, [c.text for c in pool])
        for c, score in zip(pool, scores, strict=True):
            c.rerank = float(score)
        name = getattr(reranker, "model_name", "cross-encoder")
        trace.reranker = f"{name} scored {len(pool)} of {len(candidates)} candidates over full text"


def vector_text(vector: Any) -> str:
    """pgvector's text form of a query vector (what its SQLAlchemy type would send)."""
    return "[" + ",".join(map(str, np.asarray(vector, dtype=np.float32).tolist())) + "]"


def _loaded(result: CursorResult[Any]) -> list[dict[str, Any]]:
    """The recall statement's rows as the driver hands them over (one ``fetchall``, each row a
    dict by column name: SQLAlchemy's row mappings cost 1.4 ms more for a 225-row pool), each
    embedding read from pgvector's binary form (``statement.VectorBytes``)."""
    cursor = result.cursor
    names = [column[0] for column in cursor.description]
    rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    result.close()
    for row in rows:
        row["embedding"] = vector_from_bytes(row["embedding"])
    return rows


@dataclass(frozen=True)
class _Background:
    access: AccessCounts
    usage: UsageRows
    chainer: ReceiptChainer
    engine: Engine  # its own small pool over the recall engine's database and role


_BACKGROUND: weakref.WeakKeyDictionary[Engine, _Background] = weakref.WeakKeyDictionary()
_BACKGROUND_LOCK = threading.Lock()


BACKGROUND_POOL = 2


def _background(engine: Engine, settings: Settings) -> _Background:
    """The access counts, usage rows and receipt chainer of ``engine``: one per engine in a
    process, so every recaller over it shares one background thread (and ``settle`` settles
    them all). The thread writes through a pool of its own (``BACKGROUND_POOL`` connections,
    the same database and role): it returned its connection to the recalls' pool moments
    after each recall returned its own, so the next recall took the background's, where the
    size class's plan had not been made (LIFO hands out the connection returned last), and
    at light load every other recall planned its statement again (45-70 ms against 11-17)
    until each connection the two had passed between held the plan."""
    from orchestrator.audit.chainer import ReceiptChainer

    with _BACKGROUND_LOCK:
        found = _BACKGROUND.get(engine)
        if found is None:
            side = _side_engine(engine)
            access, usage = AccessCounts(side), UsageRows(side)
            chainer = ReceiptChainer(side, delay_s=settings.recall_chain_delay_s,
                                     interval_s=settings.recall_chain_interval_s)
            chainer.tasks += [access.flush, usage.flush]
            found = _BACKGROUND[engine] = _Background(access, usage, chainer, side)
            if not event.contains(engine, "engine_disposed", _forget_background):
                event.listen(engine, "engine_disposed", _forget_background)
        return found


def _forget_background(engine: Engine) -> None:
    """``engine`` was disposed (its database may be about to go): settle and stop its
    background thread, rather than leave it polling a database that is gone. A later recall
    over the same engine starts a new one."""
    with _BACKGROUND_LOCK:
        found = _BACKGROUND.pop(engine, None)
    if found is not None:
        found.chainer.close()
        if found.engine is not engine:
            found.engine.dispose()
        engine.pool.dispose()  # the last chaining may have opened a connection


def _side_engine(engine: Engine) -> Engine:
    """A small pool over ``engine``'s database, role and checks (``make_app_engine``'s for an
    application engine); ``engine`` itself where its driver is not psycopg's."""
    if engine.dialect.driver != "psycopg":
        return engine
    from orchestrator.db.engine import make_app_engine

    return make_app_engine(engine.url.render_as_string(hide_password=False),
                           pool_size=BACKGROUND_POOL, max_overflow=BACKGROUND_POOL)


def close_background() -> None:
    """Settle and stop every recall background thread of this process (before a database it
    writes to goes away: the end of a test session, a server shutting down)."""
    with _BACKGROUND_LOCK:
        found = list(_BACKGROUND.values())
    for background in found:
        background.chainer.close()


def flush_usage(engine: Engine) -> None:
    """Write the usage rows this process queued over ``engine`` now: feedback (``mark_used``)
    sent right after a recall then finds the recall's event, whose time is its write."""
    with _BACKGROUND_LOCK:
        found = _BACKGROUND.get(engine)
    if found is not None and found.usage.waiting:
        found.usage.flush()


class _ServiceReranker:
    """The worker's model service seen as the tail's ``CrossEncoder``."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self.model_name = getattr(getattr(service, "reranker", None), "model_name",
                                  "cross-encoder")

    @property
    def available(self) -> bool:
        return bool(self._service.reranker_available)

    @property
    def note(self) -> str | None:
        note: str | None = self._service.reranker_note
        return note

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        return list(self._service.rerank(query, passages).scores)


_default: Recaller | None = None


def default_recaller() -> Recaller:
    """The process's recaller over the configured database as ``engram_app``."""
    global _default
    if _default is None:
        from orchestrator.db.engine import Database, make_app_engine

        settings = get_settings()
        _default = Recaller(make_app_engine(Database(settings).app_url()), settings)
    return _default


def recall(identity: Identity, question: str, asker: str | None = None,
           budget_tokens: int | None = None, mode: str | None = None, *,
           session: str | None = None, recaller: Recaller | None = None) -> RecallResult:
    """Recall evidence for ``question`` as ``identity``, cut to ``budget_tokens``."""
    return (recaller or default_recaller()).recall(identity, question, asker, budget_tokens, mode,
                                                   session)


def memory_prepare(identity: Identity, question: str, asker: str | None = None,
                   budget_tokens: int | None = None, mode: str | None = None, *,
                   session: str | None = None, recaller: Recaller | None = None
                   ) -> PreparedMemory:
    """One bundle for a prompt under one budget: evidence, keyed facts about the entities
    in play, lessons, recent episodes and top documents."""
    return (recaller or default_recaller()).prepare(identity, question, asker, budget_tokens,
                                                    mode, session)[0]
