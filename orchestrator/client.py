"""Engram in-process: the GraphQL API's calls as Python methods.

``Engram`` is for programs that run next to the database (notebooks, jobs,
agents in the same process). It takes a *token*, never an identity: the token
is verified exactly as the HTTP API verifies it, so the same scope lattice and
the same row level security apply. Each call is one transaction under that
identity and calls the same service functions as the GraphQL resolvers; errors
are Engram's hierarchy (``orchestrator.errors``), with the same codes.

    from orchestrator.client import Engram

    with Engram.connect(token) as engram:
        engram.upsert_document("notes", "a.md", "A", "Body ...", scopes=["team"])
        page = engram.documents(first=10)
        ann = engram.resolve_entity("person", "Ann", scopes=["team"])
        engram.assert_fact(ann, "title", "Ann is staff engineer", ["team"], value="staff engineer",
                           fact_key="hr.ann.title", as_of="2026-01-01T00:00:00+00:00", authority=50)
        result = engram.recall("What is A about?")
        print(result.rendered)
        engram.mark_used([(e.item_table, e.item_id) for e in result.evidence[:1]])
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Literal, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from orchestrator.api import audit
from orchestrator.api import documents as ops
from orchestrator.api import entities as ents
from orchestrator.api.audit import AuditorEngine, ChainSummary, LineageView, ReceiptView
from orchestrator.api.documents import DocumentPage, DocumentView, Page, ScopeView
from orchestrator.api.entities import EntityPage, EntityView
from orchestrator.auth import Identity
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.config import Settings, get_settings
from orchestrator.db.session import bound_session
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest import memory as mem
from orchestrator.ingest.documents import DocumentInput, PutResult
from orchestrator.ingest.knowledge import (
    AssertResult,
    ConflictRow,
    EpistemicKind,
    Fact,
    QuarantineRow,
    Strategy,
)
from orchestrator.recall import Recaller, RecallResult
from orchestrator.recall.prepare import PreparedMemory
from orchestrator.recall.trace import Trace

T = TypeVar("T")

__all__ = [
    "AssertResult",
    "ChainSummary",
    "ConflictRow",
    "DocumentPage",
    "DocumentView",
    "Engram",
    "EntityPage",
    "EntityView",
    "Fact",
    "LineageView",
    "Page",
    "PreparedMemory",
    "QuarantineRow",
    "RecallResult",
    "ReceiptView",
    "ScopeView",
    "Trace",
]


class Engram:
    """One verified identity's handle on Engram."""

    def __init__(self, engine: Engine, token: str, settings: Settings | None = None, *,
                 verifier: TokenVerifier | None = None, recaller: Recaller | None = None,
                 auditor: Callable[[], Engine] | None = None, channel: str = "python") -> None:
        self.settings = settings or get_settings()
        self.engine = engine
        self.identity: Identity = (verifier or TokenVerifier.from_settings(self.settings)).verify(token)
        self._recaller = recaller
        self._owns_auditor = auditor is None
        self._auditor: Callable[[], Engine] = auditor or AuditorEngine(self.settings)
        self.channel = channel
        self._owns_engine = False

    @classmethod
    def connect(cls, token: str, settings: Settings | None = None) -> Engram:
        """Connect to the configured database as ``engram_app``; close (or ``with``) when done."""
        from orchestrator.db.engine import Database, make_app_engine

        settings = settings or get_settings()
        client = cls(make_app_engine(Database(settings).app_url(), pool_size=2), token, settings)
        client._owns_engine = True
        return client

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()
        if self._owns_auditor and isinstance(self._auditor, AuditorEngine):
            self._auditor.dispose()

    def __enter__(self) -> Engram:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A ``bound_session`` of this identity, for calls this class does not wrap."""
        with bound_session(self.engine, self.identity) as s:
            yield s

    def _run(self, call: Callable[[Session], T]) -> T:
        with self.session() as s:
            return call(s)

    def scopes(self) -> list[ScopeView]:
        return self._run(lambda s: ops.list_scopes(s, self.identity))

    def documents(self, *, first: int = 20, after: str | None = None, collection: str | None = None,
                  kind: str | None = None, state: str | None = None,
                  include_hidden: bool = False) -> DocumentPage:
        return self._run(lambda s: ops.list_documents(
            s, self.identity, self.settings, first=first, after=after, collection=collection,
            kind=kind, state=state, include_hidden=include_hidden))

    def document(self, collection: str, path: str) -> DocumentView | None:
        return self._run(lambda s: ops.get_document(s, self.identity, collection, path))

    def document_by_id(self, doc_id: uuid.UUID | str) -> DocumentView:
        """``NotFound`` when there is no document with this id the caller may read."""
        return self._run(lambda s: ops.document_by_id(s, self.identity, _id(doc_id)))

    def upsert_document(self, collection: str, path: str, title: str, body: str, *,
                        scopes: list[str] | tuple[str, ...], kind: str = "note",
                        state: str | None = None, area: str | None = None,
                        metadata: dict[str, Any] | None = None,
                        occurred_at: datetime | str | None = None
                        ) -> tuple[PutResult, DocumentView]:
        """``occurred_at``: when what the document describes happened (the timeline lane)."""
        doc = DocumentInput(collection, path, title, body, tuple(scopes), kind, state, area, metadata,
                            occurred_at)
        return self._run(lambda s: ops.upsert_document(s, self.identity, doc, self.settings))

    def delete_document(self, collection: str, path: str) -> uuid.UUID:
        return self._run(lambda s: ops.remove_document(s, collection, path))

    def pin(self, doc_id: uuid.UUID | str, pinned: bool = True) -> DocumentView:
        return self._run(lambda s: ops.pin(s, self.identity, _id(doc_id), pinned))

    def snooze(self, doc_id: uuid.UUID | str, until: datetime | None) -> DocumentView:
        return self._run(lambda s: ops.snooze(s, self.identity, _id(doc_id), until))

    def archive(self, doc_id: uuid.UUID | str, archived: bool = True) -> DocumentView:
        return self._run(lambda s: ops.archive(s, self.identity, _id(doc_id), archived))

    # --- entities and knowledge -------------------------------------------------------

    def entity(self, entity_type: str, name: str) -> uuid.UUID | None:
        """The id of the entity of this type named (or aliased) ``name``; never creates one."""
        return self._run(lambda s: kn.resolve_entity(s, entity_type, name, create=False))

    def resolve_entity(self, entity_type: str, name: str, scopes: Sequence[str]) -> uuid.UUID:
        """The entity of this type named ``name``, created (shared into ``scopes``) when missing."""
        found = self._run(lambda s: kn.resolve_entity(s, entity_type, name, scopes))
        assert found is not None  # create=True always returns an id or raises
        return found

    def entities(self, *, query: str | None = None, entity_type: str | None = None,
                 first: int = 20, after: str | None = None, retracted: bool = False) -> EntityPage:
        return self._run(lambda s: ents.list_entities(s, self.identity, self.settings, query=query,
                                                      entity_type=entity_type, first=first,
                                                      after=after, retracted=retracted))

    def entity_by_id(self, entity_id: uuid.UUID | str) -> EntityView:
        return self._run(lambda s: ents.entity_by_id(s, self.identity, _id(entity_id, "entity")))

    def facts(self, entity_id: uuid.UUID | str, *, include_beaten: bool = False,
              first: int = 100) -> list[Fact]:
        limit = ops.check_first(first, self.settings.api_max_page_size)
        return self._run(lambda s: kn.current_facts(s, _id(entity_id, "entity"),
                                                    include_beaten=include_beaten, limit=limit))

    def assert_fact(self, subject_id: uuid.UUID | str, predicate: str, text: str,
                    scopes: Sequence[str], *, value: kn.Literal_ | None = None,
                    object_id: uuid.UUID | str | None = None, datatype: str | None = None,
                    kind: EpistemicKind = "world_fact", author_role: str = "user",
                    confidence: float = 1.0, authority: int = 0,
                    valid_from: datetime | str | None = None, valid_to: datetime | str | None = None,
                    fact_key: str | None = None, as_of: datetime | str | None = None) -> AssertResult:
        """Assert a claim (a keyed fact with ``fact_key`` and ``as_of``); it lands, or comes back
        quarantined with the reasons."""
        fact = kn.FactInput(
            subject_id=_id(subject_id, "subject"), predicate=predicate, text=text,
            scopes=tuple(scopes), value=value,
            object_id=_id(object_id, "object") if object_id is not None else None,
            datatype=datatype, kind=kind, author_role=author_role, confidence=confidence,
            authority=authority, valid_from=valid_from, valid_to=valid_to, fact_key=fact_key,
            as_of=as_of)
        return self._run(lambda s: kn.assert_fact(s, fact))

    def conflicts(self, *, status: str | None = None, first: int = 100) -> list[ConflictRow]:
        limit = ops.check_first(first, self.settings.api_max_page_size)
        return self._run(lambda s: kn.conflicts(s, status=status, limit=limit))

    def resolve_conflict(self, conflict_id: uuid.UUID | str, strategy: Strategy,
                         winner: uuid.UUID | str | None = None) -> uuid.UUID | None:
        """Resolve with a strategy; the winning claim (None for keep_both)."""
        return self._run(lambda s: kn.resolve_conflict(
            s, _id(conflict_id, "conflict"), strategy,
            _id(winner, "claim") if winner is not None else None))

    def quarantine(self, *, status: str | None = "held", first: int = 100) -> list[QuarantineRow]:
        limit = ops.check_first(first, self.settings.api_max_page_size)
        return self._run(lambda s: kn.quarantine(s, status=status, limit=limit))

    def release_quarantine(self, quarantine_id: uuid.UUID | str,
                           corrections: dict[str, Any] | None = None) -> AssertResult:
        """Retry a held claim with ``corrections``; it lands, or stays held with new reasons."""
        return self._run(lambda s: kn.release_quarantine(s, _id(quarantine_id, "quarantine"),
                                                         corrections))

    # --- memory ---------------------------------------------------------------------

    def remember(self, session_id: str, text: str, scopes: Sequence[str], *,
                 ttl_seconds: int = 86_400) -> uuid.UUID:
        """A recent session item of this user, recallable for ``ttl_seconds``."""
        ttl = mem.ttl_seconds(ttl_seconds)
        return self._run(lambda s: mem.add_working_memory(s, session_id, text, scopes, ttl=ttl))

    def working_memory(self, session_id: str | None = None, *, first: int = 100) -> list[str]:
        limit = ops.check_first(first, self.settings.api_max_page_size)
        return self._run(lambda s: mem.working_memory(s, session_id, limit=limit))

    def record_decision(self, category: str, scenario: str, reasoning: str, confidence: float,
                        scopes: Sequence[str], *, outcome: str | None = None) -> uuid.UUID:
        decision = mem.DecisionInput(category, scenario, reasoning, confidence, tuple(scopes), outcome)
        return self._run(lambda s: mem.record_decision(s, decision))

    def record_episode(self, session_id: str, summary: str, started_at: datetime,
                       ended_at: datetime, scopes: Sequence[str], *, turn_count: int = 0
                       ) -> uuid.UUID:
        return self._run(lambda s: mem.record_episode(s, session_id, summary, started_at, ended_at,
                                                      scopes, turn_count=turn_count))

    def mark_used(self, items: Sequence[tuple[str, uuid.UUID | str]] = (), *,
                  claim_ids: Sequence[uuid.UUID | str] = ()) -> int:
        """Feedback: these served items helped. ``items`` are evidence handles
        ``(item_table, item_id)``; ``claim_ids`` the short form for facts. Returns how many
        were recorded; an unreadable item is ``NotFound`` and then nothing is recorded."""
        from orchestrator.derive.lifecycle import mark_evidence_used

        used = [(table, _id(i, "item")) for table, i in items]
        claims = [_id(c, "claim") for c in claim_ids]
        return self._run(lambda s: mark_evidence_used(s, used, claim_ids=claims, channel=self.channel))

    # --- auditors -------------------------------------------------------------------

    def verify_chain(self, *, rows: bool = True) -> ChainSummary:
        """Auditors only: recompute this tenant's provenance hash chain."""
        tenant = self._run(lambda s: audit.auditor_tenant(s, self.identity, "verify_chain"))
        return audit.verify_chain(self._auditor(), tenant, rows=rows)

    def verify_receipt(self, receipt_id: uuid.UUID | str, *,
                       rendered: str | None = None) -> ReceiptView:
        """Auditors only: re-derive a recall receipt of this tenant."""
        tenant = self._run(lambda s: audit.auditor_tenant(s, self.identity, "verify_receipt"))
        return audit.verify_receipt(self._auditor(), tenant, _id(receipt_id, "receipt"),
                                    rendered=rendered)

    def provenance(self, table: str, row_id: dict[str, Any], *,
                   direction: Literal["back", "forward"] = "back", max_depth: int = 10) -> LineageView:
        """Auditors only: the derivation lineage of a row of this tenant."""
        tenant = self._run(lambda s: audit.auditor_tenant(s, self.identity, "provenance"))
        return audit.provenance(self._auditor(), tenant, table, row_id, direction=direction,
                                max_depth=max_depth)

    # --- recall ---------------------------------------------------------------------

    @property
    def recaller(self) -> Recaller:
        if self._recaller is None:
            self._recaller = Recaller(self.engine, self.settings)
        return self._recaller

    def recall(self, question: str, *, asker: str | None = None, budget_tokens: int | None = None,
               mode: str | None = None, session: str | None = None) -> RecallResult:
        """``session``: the asker's current working-memory session (all of theirs when None)."""
        return self.recaller.recall(self.identity, question, asker, budget_tokens, mode, session,
                                    self.channel)

    def trace(self, question: str, *, asker: str | None = None, budget_tokens: int | None = None,
              mode: str | None = None, session: str | None = None) -> tuple[RecallResult, Trace]:
        """A recall with every stage's trace (``engram trace``)."""
        return self.recaller.trace(self.identity, question, asker, budget_tokens, mode, session,
                                   self.channel)

    def memory_prepare(self, question: str, *, asker: str | None = None,
                       budget_tokens: int | None = None, mode: str | None = None,
                       session: str | None = None) -> PreparedMemory:
        """One bundle under one budget: keyed facts, evidence, lessons, episodes, documents."""
        return self.recaller.prepare(self.identity, question, asker, budget_tokens, mode,
                                     session, self.channel)[0]


def _id(value: uuid.UUID | str, what: str = "document") -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else ops.parse_id(value, what)
