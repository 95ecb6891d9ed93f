"""Engram in-process: the GraphQL API's calls as Python methods.

``Engram`` is for programs that run next to the database (notebooks, jobs,
agents in the same process). It takes a *token*, never an identity: the token
is verified exactly as the HTTP API verifies it, so the same scope lattice and
the same row level security apply. Each call is one transaction under that
identity; errors are Engram's hierarchy (``orchestrator.errors``).

    from orchestrator.client import Engram

    with Engram.connect(token) as engram:
        engram.upsert_document("notes", "a.md", "A", "Body ...", scopes=["team"])
        page = engram.documents(first=10)
        result = engram.recall("What is A about?")
        print(result.rendered)
        bundle = engram.memory_prepare("What is A about?", budget_tokens=1500)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from orchestrator.api import documents as ops
from orchestrator.api.documents import DocumentPage, DocumentView, ScopeView
from orchestrator.auth import Identity
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.config import Settings, get_settings
from orchestrator.db.session import bound_session
from orchestrator.ingest.documents import DocumentInput, PutResult
from orchestrator.recall import Recaller, RecallResult
from orchestrator.recall.prepare import PreparedMemory

T = TypeVar("T")

__all__ = ["DocumentPage", "DocumentView", "Engram", "PreparedMemory", "RecallResult", "ScopeView"]


class Engram:
    """One verified identity's handle on Engram."""

    def __init__(self, engine: Engine, token: str, settings: Settings | None = None, *,
                 verifier: TokenVerifier | None = None, recaller: Recaller | None = None) -> None:
        self.settings = settings or get_settings()
        self.engine = engine
        self.identity: Identity = (verifier or TokenVerifier.from_settings(self.settings)).verify(token)
        self._recaller = recaller
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

    def document_by_id(self, doc_id: uuid.UUID | str) -> DocumentView | None:
        return self._run(lambda s: ops.get_document_by_id(s, self.identity, _id(doc_id)))

    def upsert_document(self, collection: str, path: str, title: str, body: str, *,
                        scopes: list[str] | tuple[str, ...], kind: str = "note",
                        state: str | None = None, area: str | None = None,
                        metadata: dict[str, Any] | None = None) -> tuple[PutResult, DocumentView]:
        doc = DocumentInput(collection, path, title, body, tuple(scopes), kind, state, area, metadata)
        return self._run(lambda s: ops.upsert_document(s, self.identity, doc, self.settings))

    def delete_document(self, collection: str, path: str) -> uuid.UUID:
        return self._run(lambda s: ops.remove_document(s, collection, path))

    def pin(self, doc_id: uuid.UUID | str, pinned: bool = True) -> DocumentView:
        return self._run(lambda s: ops.pin(s, self.identity, _id(doc_id), pinned))

    def snooze(self, doc_id: uuid.UUID | str, until: datetime | None) -> DocumentView:
        return self._run(lambda s: ops.snooze(s, self.identity, _id(doc_id), until))

    def archive(self, doc_id: uuid.UUID | str, archived: bool = True) -> DocumentView:
        return self._run(lambda s: ops.archive(s, self.identity, _id(doc_id), archived))

    @property
    def recaller(self) -> Recaller:
        if self._recaller is None:
            self._recaller = Recaller(self.engine, self.settings)
        return self._recaller

    def recall(self, question: str, *, asker: str | None = None, budget_tokens: int | None = None,
               mode: str | None = None) -> RecallResult:
        return self.recaller.recall(self.identity, question, asker, budget_tokens, mode)

    def memory_prepare(self, question: str, *, asker: str | None = None,
                       budget_tokens: int | None = None, mode: str | None = None) -> PreparedMemory:
        """One bundle under one budget: keyed facts, evidence, lessons, episodes, documents."""
        return self.recaller.prepare(self.identity, question, asker, budget_tokens, mode)[0]


def _id(value: uuid.UUID | str) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else ops.parse_id(value)
