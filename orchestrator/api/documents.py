"""Document operations shared by the GraphQL resolvers, the Python client and the CLI.

Each function takes a ``bound_session`` and returns plain dataclasses; what a
caller may see or change is decided by row level security. Two refusals are
told apart on purpose: a row the caller cannot read is ``NotFound`` (whether it
exists in another tenant or nowhere is not revealed), a row the caller can read
but not write is ``Forbidden``.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, tuple_, update
from sqlalchemy.orm import Session

from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.models import Chunk, Document, Scope
from orchestrator.errors import BadInput, Forbidden, NotFound
from orchestrator.ingest.documents import DocumentInput, PutResult, delete_document, put_document


@dataclass(frozen=True)
class ScopeView:
    name: str
    description: str
    can_read: bool
    can_write: bool


@dataclass(frozen=True)
class DocumentView:
    id: uuid.UUID
    collection: str
    path: str
    title: str
    kind: str
    state: str | None
    area: str | None
    body: str
    content_hash: str
    scopes: list[ScopeView]
    author: str | None
    metadata: dict[str, Any]
    pinned: bool
    snoozed_until: datetime | None
    archived_at: datetime | None
    created_at: datetime
    updated_at: datetime
    chunk_count: int


@dataclass(frozen=True)
class DocumentPage:
    items: list[tuple[str, DocumentView]]
    has_next_page: bool

    @property
    def end_cursor(self) -> str | None:
        return self.items[-1][0] if self.items else None


def parse_id(value: str, what: str = "document") -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError as exc:
        raise BadInput(f"{what} id {value!r} is not a UUID") from exc


def list_scopes(session: Session, identity: Identity) -> list[ScopeView]:
    rows = session.execute(select(Scope.name, Scope.description).order_by(Scope.name)).all()
    return [ScopeView(name, desc, name in identity.readable, name in identity.write_scopes)
            for name, desc in rows]


def _views(session: Session, identity: Identity, docs: list[Document]) -> list[DocumentView]:
    if not docs:
        return []
    scopes = {sid: ScopeView(name, desc, name in identity.readable, name in identity.write_scopes)
              for sid, name, desc in session.execute(select(Scope.id, Scope.name, Scope.description))}
    counts: dict[uuid.UUID, int] = dict(session.execute(
        select(Chunk.document_id, func.count()).where(Chunk.document_id.in_([d.id for d in docs]))
        .group_by(Chunk.document_id)).all())
    return [DocumentView(
        id=d.id, collection=d.collection, path=d.path, title=d.title, kind=d.kind, state=d.state,
        area=d.area, body=d.body, content_hash=d.content_hash.hex(),
        scopes=sorted((scopes[s] for s in d.scopes if s in scopes), key=lambda v: v.name),
        author=d.author, metadata=d.metadata_, pinned=d.pinned, snoozed_until=d.snoozed_until,
        archived_at=d.archived_at, created_at=d.created_at, updated_at=d.updated_at,
        chunk_count=int(counts.get(d.id, 0)),
    ) for d in docs]


def encode_cursor(collection: str, path: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([collection, path]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise BadInput("the cursor is not one this API handed out") from exc
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise BadInput("the cursor is not one this API handed out")
    return value[0], value[1]


def _visible_now() -> ColumnElement[bool]:
    return and_(Document.archived_at.is_(None),
                or_(Document.snoozed_until.is_(None), Document.snoozed_until <= func.now()))


def list_documents(session: Session, identity: Identity, settings: Settings, *, first: int = 20,
                   after: str | None = None, collection: str | None = None, kind: str | None = None,
                   state: str | None = None, include_hidden: bool = False) -> DocumentPage:
    if not 1 <= first <= settings.api_max_page_size:
        raise BadInput(f"first must be between 1 and {settings.api_max_page_size}, not {first}")
    stmt = select(Document)
    if after is not None:
        stmt = stmt.where(tuple_(Document.collection, Document.path) > tuple_(*decode_cursor(after)))
    if collection is not None:
        stmt = stmt.where(Document.collection == collection)
    if kind is not None:
        stmt = stmt.where(Document.kind == kind)
    if state is not None:
        stmt = stmt.where(Document.state == state)
    if not include_hidden:
        stmt = stmt.where(_visible_now())
    docs = list(session.execute(
        stmt.order_by(Document.collection, Document.path).limit(first + 1)).scalars())
    more = len(docs) > first
    views = _views(session, identity, docs[:first])
    return DocumentPage([(encode_cursor(v.collection, v.path), v) for v in views], more)


def get_document(session: Session, identity: Identity, collection: str, path: str
                 ) -> DocumentView | None:
    doc = session.execute(select(Document).where(
        Document.collection == collection, Document.path == path)).scalar_one_or_none()
    return _views(session, identity, [doc])[0] if doc is not None else None


def get_document_by_id(session: Session, identity: Identity, doc_id: uuid.UUID
                       ) -> DocumentView | None:
    doc = session.execute(select(Document).where(Document.id == doc_id)).scalar_one_or_none()
    return _views(session, identity, [doc])[0] if doc is not None else None


def upsert_document(session: Session, identity: Identity, doc: DocumentInput, settings: Settings
                    ) -> tuple[PutResult, DocumentView]:
    result = put_document(session, doc, settings)
    view = get_document_by_id(session, identity, result.document_id)
    if view is None:  # written into scopes the caller cannot read back: impossible (write implies read)
        raise Forbidden("the document was written but cannot be read back")
    return result, view


def remove_document(session: Session, collection: str, path: str) -> uuid.UUID:
    return delete_document(session, collection, path)


def _change(session: Session, identity: Identity, doc_id: uuid.UUID, what: str,
            values: dict[str, Any]) -> DocumentView:
    changed = session.execute(
        update(Document).where(Document.id == doc_id).values(**values).returning(Document.id)
    ).scalar()
    if changed is None:
        if session.execute(select(Document.id).where(Document.id == doc_id)).scalar() is None:
            raise NotFound(f"no document {doc_id} that you can read")
        raise Forbidden(f"you may read document {doc_id} but not {what} it: "
                        "that needs write on every scope it is shared into")
    view = get_document_by_id(session, identity, doc_id)
    assert view is not None
    return view


def pin(session: Session, identity: Identity, doc_id: uuid.UUID, pinned: bool = True) -> DocumentView:
    return _change(session, identity, doc_id, "pin", {"pinned": pinned})


def snooze(session: Session, identity: Identity, doc_id: uuid.UUID, until: datetime | None
           ) -> DocumentView:
    if until is not None and until.tzinfo is None:
        raise BadInput("snooze needs a moment with a time zone (ISO 8601 with offset or Z)")
    return _change(session, identity, doc_id, "snooze", {"snoozed_until": until})


def archive(session: Session, identity: Identity, doc_id: uuid.UUID, archived: bool = True
            ) -> DocumentView:
    return _change(session, identity, doc_id, "archive",
                   {"archived_at": func.now() if archived else None})
