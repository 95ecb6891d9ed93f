"""Fixtures for the recall tests: the packaged embedder, writing embedded documents, a recaller.

Documents are written through ``put_document`` inside ``bound_session`` as the
application role; their chunks are embedded here with the real packaged
MiniLM and written back through the app role's column grants, which is what the
embedding worker does for a live installation.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.models import Chunk
from orchestrator.db.session import bound_session
from orchestrator.ingest.documents import DocumentInput, put_document
from orchestrator.recall import Recaller


@pytest.fixture(scope="session")
def embedder(settings: Settings) -> Any:
    from orchestrator.worker.embedder import Embedder

    return Embedder.from_settings(settings)


@pytest.fixture
def recaller(app_engine: Engine, settings: Settings, embedder: Any) -> Recaller:
    return Recaller(app_engine, settings, embedder=embedder)


def write_documents(engine: Engine, identity: Identity, embedder: Any,
                    docs: Iterable[DocumentInput], settings: Settings,
                    **fields: dict[str, Any]) -> dict[str, Any]:
    """Write and embed documents; ``fields`` maps a path to extra column values
    (pinned, archived_at, snoozed_until) set after the write. Returns path -> id."""
    ids: dict[str, Any] = {}
    with bound_session(engine, identity) as session:
        for doc in docs:
            ids[doc.path] = put_document(session, doc, settings).document_id
        pending = session.execute(
            select(Chunk.id, Chunk.text).where(Chunk.embed_state == "pending")).all()
        if pending:
            vectors = embedder.embed_passages([t for _, t in pending])
            for (cid, _), vec in zip(pending, vectors, strict=True):
                session.execute(update(Chunk).where(Chunk.id == cid).values(
                    embedding=vec, embed_state="ready", embed_model="test-minilm",
                    embedded_at=datetime.now(UTC)))
        from orchestrator.db.models import Document

        for path, values in fields.items():
            session.execute(update(Document).where(Document.path == path).values(**values))
    return ids


def doc(path: str, title: str, body: str, scopes: tuple[str, ...] = ("team",),
        **kw: Any) -> DocumentInput:
    return DocumentInput(collection="notes", path=path, title=title, body=body, scopes=scopes,
                         **kw)


def embed_pending(test_db: Any, embedder: Any, settings: Settings, tenant: Any) -> int:
    """Drain the embedding queue of one tenant with the real worker (as engram_worker)."""
    from orchestrator.db.engine import make_app_engine
    from orchestrator.worker.queue import QueueWorker

    engine = make_app_engine(test_db.database.role_url("engram_worker"), pool_size=1)
    try:
        worker = QueueWorker(engine, embedder, settings, tenants=[tenant])
        return worker.drain().rows
    finally:
        engine.dispose()


def recaller_with(app_engine: Engine, settings: Settings, embedder: Any, **overrides: Any) -> Recaller:
    """A recaller whose settings differ in ``overrides`` (e.g. smaller lane pools)."""
    return Recaller(app_engine, settings.model_copy(update=overrides), embedder=embedder)
