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

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine, event, func, select

from orchestrator.auth import Identity
from orchestrator.config import Settings, get_settings
from orchestrator.db.models import Installation
from orchestrator.db.session import bound_session
from orchestrator.errors import BadInput, EngramError
from orchestrator.inputs import text_problem
from orchestrator.recall.plan import FULL_PLAN, PlanShape
from orchestrator.recall.prepare import PreparedMemory, build_bundle
from orchestrator.recall.render import render
from orchestrator.recall.result import RecallResult, Served
from orchestrator.recall.statement import (
    MODEL_GENERATION,
    MODES,
    StatementLimits,
    build_recall_statement,
)
from orchestrator.recall.tail import (
    CLAIMS,
    Candidate,
    apply_precedence,
    assign_merit,
    budget_cut,
    candidates_from_rows,
    order,
    suppress_duplicates,
)
from orchestrator.recall.trace import Trace, item
from orchestrator.worker.registry import ActiveModel, ModelMismatch, read_active

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
                 reranker: CrossEncoder | None = None, index_tier: str | None = None) -> None:
        self.engine = engine
        self.settings = settings or get_settings()
        self._embedder = embedder
        self._reranker = reranker
        self._index_tier = index_tier
        self._statements: dict[str, Any] = {}
        self._active: ActiveModel | None = None
        self._services: dict[str, QueryEmbedder] = {}
        self.warmed = False

    @property
    def active_model(self) -> ActiveModel:
        """The model questions are embedded with now; ``key`` names it and its activation
        (what a cache of query embeddings keys by)."""
        if self._active is None:
            return self.refresh_model()
        return self._active

    def refresh_model(self) -> ActiveModel:
        """Read the registry again (after a recall saw another generation)."""
        with self.engine.connect() as conn:
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

        The statement runs in a transaction with no identity bound, where row level
        security shows it nothing, and is rolled back: it writes nothing and reads no row.
        The query model runs twice (its first call is much slower than the second)."""
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
        stmt = self.statement(FULL_PLAN)
        with self.engine.connect() as conn, conn.begin() as tx:
            conn.execute(stmt, {"question": "warm up", "query_embedding": vector, "mode": None,
                                "session": None}).mappings().all()
            tx.rollback()
        lap("statement")
        candidates_from_rows([], catalog_rrf=0.0)
        render("warm up", [])
        lap("tail")
        self.warmed = True
        return laps

    @property
    def index_tier(self) -> str:
        """The installation's index tier (``engram.installation``), read once."""
        if self._index_tier is None:
            with self.engine.connect() as conn:
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

    def statement(self, shape: PlanShape) -> Any:
        stmt = self._statements.get(shape.name)
        if stmt is None:
            stmt = build_recall_statement(shape, StatementLimits.from_settings(self.settings),
                                          self.index_tier)
            self._statements[shape.name] = stmt
        return stmt

    def recall(self, identity: Identity, question: str, asker: str | None = None,
               budget_tokens: int | None = None, mode: str | None = None,
               session: str | None = None) -> RecallResult:
        """``session`` names the asker's current working-memory session: the working-memory
        lane reads that session only (every unexpired item of the user when it is None)."""
        return self._run(identity, question, asker, budget_tokens, mode, FULL_PLAN, self._cut,
                         session)[0]

    def trace(self, identity: Identity, question: str, asker: str | None = None,
              budget_tokens: int | None = None, mode: str | None = None,
              session: str | None = None) -> tuple[RecallResult, Trace]:
        return self._run(identity, question, asker, budget_tokens, mode, FULL_PLAN, self._cut,
                         session)

    def prepare(self, identity: Identity, question: str, asker: str | None = None,
                budget_tokens: int | None = None, mode: str | None = None,
                session: str | None = None) -> tuple[PreparedMemory, Trace]:
        """``memory_prepare``: the same statement and tail, cut into one bundle under one budget."""
        settings = self.settings

        def finish(req: RecallRequest, ordered: list[Candidate], trace: Trace) -> PreparedMemory:
            return build_bundle(req.question, req.asker, req.budget_tokens, ordered, trace,
                                settings.recall_chars_per_token)

        return self._run(identity, question, asker, budget_tokens, mode, FULL_PLAN, finish, session)

    def study(self, identity: Identity, question: str, shape: PlanShape, asker: str | None = None,
              budget_tokens: int | None = None, mode: str | None = None,
              session: str | None = None) -> tuple[RecallResult, Trace]:
        """Evaluation only: run a plan-study shape through the same builder and tail."""
        return self._run(identity, question, asker, budget_tokens, mode, shape, self._cut, session)

    def _cut(self, req: RecallRequest, ordered: list[Candidate], trace: Trace) -> RecallResult:
        """Recall's end: the longest prefix of the order whose rendering fits the budget."""
        kept, rendered, used = budget_cut(ordered, req.budget_tokens,
                                          self.settings.recall_chars_per_token,
                                          lambda ev: render(req.question, ev))
        trace.kept, trace.used_tokens = kept, used
        return RecallResult(req.question, req.asker, req.budget_tokens, used,
                            tuple(c.evidence() for c in ordered[:kept]), rendered)

    def _run(self, identity: Identity, question: str, asker: str | None,
             budget_tokens: int | None, mode: str | None, shape: PlanShape,
             finish: Callable[[RecallRequest, list[Candidate], Trace], R],
             session_id: str | None = None) -> tuple[R, Trace]:
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
            vector = self.query_embedder(model).embed_query(req.question, req.asker)
            lap("embed")
            try:
                result = self._serve(identity, req, shape, finish, trace, vector, model, lap)
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
               vector: Any, model: ActiveModel, lap: Callable[[str], None]) -> R:
        s = self.settings
        stmt = self.statement(shape)
        with bound_session(self.engine, identity) as session:
            connection = session.connection()
            with count_statements(connection) as sent:
                rows = session.execute(stmt, {"question": req.question, "query_embedding": vector,
                                              "mode": req.mode, "session": req.session}
                                       ).mappings().all()
            if rows and rows[0][MODEL_GENERATION] != model.generation:
                raise _ModelChanged()
            trace.statements = len(sent)
            trace.embedding_model = model.key
            lap("statement")

            catalog_rrf = 1.0 / (s.recall_rrf_k + s.recall_catalog_rank)
            candidates, trace.corpus = candidates_from_rows(rows, catalog_rrf=catalog_rrf)
            trace.hydration_dropped = trace.corpus.pop("hydration_dropped", [])
            for lane, rank_key in POOLS.items():
                pool = sorted((c for c in candidates if rank_key in c.lanes),
                              key=lambda c, k=rank_key: (c.lanes[k], c.key))  # type: ignore[misc]
                if pool or getattr(shape, lane):
                    trace.pools[lane] = [item(c) for c in pool]
            for kind in ("area_catalog", "project_catalog"):
                trace.pools[kind] = [item(c) for c in candidates if c.kind == kind]
            lap("hydrate")

            self._rerank(req.question, candidates, shape, trace)
            lap("rerank")
            assign_merit(candidates, s.recall_pin_boost)
            trace.fused = [item(c) for c in sorted(candidates, key=lambda c: (-c.rrf, c.key))]
            candidates, trace.precedence = apply_precedence(candidates)
            ordered, dropped = suppress_duplicates(order(candidates), s.recall_duplicate_similarity)
            trace.ordered = [item(c) for c in ordered]
            trace.suppressed = [(item(a).label, item(b).label, sim) for a, b, sim in dropped]
            lap("order")

            result = finish(req, ordered, trace)
            lap("budget_render")
            with count_statements(connection) as sent:
                self._side_effects(session, result, trace)
            trace.side_effect_statements = len(sent)
            lap("side_effects")
        return result

    def _side_effects(self, session: Any, result: Served, trace: Trace) -> None:
        """Access counters of the facts actually served, and the recall's receipt."""
        served = result.served_rows()
        served_claims = sorted({i for t, i in served if t == CLAIMS}, key=str)
        if served_claims:
            trace.touched_claims = int(session.execute(
                select(func.knowledge.touch_claims(served_claims))).scalar_one() or 0)
        if self.settings.recall_receipts and served:
            from orchestrator.audit.receipts import append_served

            trace.receipt_id = append_served(session, result.question, served, result.rendered)

    def _rerank(self, question: str, candidates: list[Candidate], shape: PlanShape,
                trace: Trace) -> None:
        if not shape.rerank:
            trace.reranker = f"off in plan shape {shape.name}; fused order is used"
            return
        reranker = self.reranker
        if not reranker.available:
            note = getattr(reranker, "note", None) or "no cross-encoder is available"
            trace.reranker = f"unavailable ({note}); fused order is used"
            return
        # The reranker sees the complete chunk text, never a truncated one; the
        # pool it scores is the best fused candidates plus every direct subject.
        pool = sorted(candidates, key=lambda c: (not c.direct, -c.rrf, c.key))
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
