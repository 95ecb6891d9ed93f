"""Document operations shared by the GraphQL resolvers, the Python client and the CLI.

Each function takes a ``bound_session`` and returns plain dataclasses; what a
caller may see or change is decided by row level security. Two refusals are
told apart on purpose: a row the caller cannot read is ``NotFound`` (whether it
exists in another tenant or nowhere is not revealed), a row the caller can read
but not write is ``Forbidden``.

Lists are Relay-style forward pages (``keyset_page``): ``first`` items after an
opaque ``after`` cursor, ordered by a unique key, with ``has_next_page`` and
``has_previous_page`` (true when rows lie at or before ``after``).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, Select, and_, func, literal, or_, select, tuple_
from sqlalchemy.orm import InstrumentedAttribute, Session

from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.models import Chunk, Document, Scope
from orchestrator.derive import lifecycle
from orchestrator.errors import BadInput, Forbidden, NotFound
from orchestrator.ingest.documents import (
    KNOWN_STATES,
    DocumentInput,
    PutResult,
    at_path,
    delete_document,
    put_document,
)
from orchestrator.inputs import one_of, text_problem


@dataclass(frozen=True)
class ScopeView:
    name: str
    description: str
    can_read: bool
    can_write: bool


@dataclass(frozen=True)
class EmbeddingProgress:
    """A document's embedding progress, from its chunks (the document has no state of its
    own): ``embedded`` once every chunk has a vector of the active model, ``failed`` once
    none is waiting and one failed for good, else ``pending``."""

    state: str
    chunks_total: int
    chunks_embedded: int
    chunks_failed: int


def embedding_progress(states: dict[str, int]) -> EmbeddingProgress:
    ready, failed, pending = (states.get(k, 0) for k in ("ready", "failed", "pending"))
    total = ready + failed + pending
    state = "pending" if pending else ("failed" if failed else "embedded")
    return EmbeddingProgress(state, total, ready, failed)


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
    embedding: EmbeddingProgress
    occurred_at: datetime | None = None


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One forward page of a connection: ``(cursor, item)`` pairs in order."""

    items: list[tuple[str, T]]
    has_next_page: bool
    has_previous_page: bool = False

    @property
    def start_cursor(self) -> str | None:
        return self.items[0][0] if self.items else None

    @property
    def end_cursor(self) -> str | None:
        return self.items[-1][0] if self.items else None


DocumentPage = Page[DocumentView]


def parse_id(value: str, what: str = "document") -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError as exc:
        raise BadInput(f"{what} id {value!r} is not a UUID") from exc


def list_scopes(session: Session, identity: Identity) -> list[ScopeView]:
    rows = session.execute(select(Scope.name, Scope.description).order_by(Scope.name)).all()
    return [ScopeView(name, desc, name in identity.readable, name in identity.write_scopes)
            for name, desc in rows]


def scope_views(session: Session, identity: Identity) -> dict[uuid.UUID, ScopeView]:
    """The tenant's scopes by id, with what ``identity`` may do in each."""
    return {sid: ScopeView(name, desc, name in identity.readable, name in identity.write_scopes)
            for sid, name, desc in session.execute(select(Scope.id, Scope.name, Scope.description))}


def scopes_of(scopes: dict[uuid.UUID, ScopeView], ids: Sequence[uuid.UUID]) -> list[ScopeView]:
    return sorted((scopes[s] for s in ids if s in scopes), key=lambda v: v.name)


def _views(session: Session, identity: Identity, docs: list[Document]) -> list[DocumentView]:
    if not docs:
        return []
    scopes = scope_views(session, identity)
    states: dict[uuid.UUID, dict[str, int]] = {d.id: {} for d in docs}
    for doc_id, state, n in session.execute(
            select(Chunk.document_id, Chunk.embed_state, func.count())
            .where(Chunk.document_id.in_([d.id for d in docs]))
            .group_by(Chunk.document_id, Chunk.embed_state)).all():
        states[doc_id][str(state)] = int(n)
    return [DocumentView(
        id=d.id, collection=d.collection, path=d.path, title=d.title, kind=d.kind, state=d.state,
        area=d.area, body=d.body, content_hash=d.content_hash.hex(),
        scopes=scopes_of(scopes, d.scopes),
        author=d.author, metadata=d.metadata_, pinned=d.pinned, snoozed_until=d.snoozed_until,
        archived_at=d.archived_at, created_at=d.created_at, updated_at=d.updated_at,
        chunk_count=sum(states[d.id].values()), embedding=embedding_progress(states[d.id]),
        occurred_at=d.occurred_at,
    ) for d in docs]


def encode_cursor(*key: str) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def decode_cursor(cursor: str, parts: int = 2) -> tuple[str, ...]:
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise BadInput("the cursor is not one this API handed out") from exc
    if not (isinstance(value, list) and len(value) == parts
            and all(isinstance(v, str) and text_problem(v) is None for v in value)):
        raise BadInput("the cursor is not one this API handed out")
    return tuple(value)


def check_first(first: int, max_page: int) -> int:
    """A page size the API accepts: 1 to ``max_page`` (``ENGRAM_API_MAX_PAGE_SIZE``)."""
    if isinstance(first, bool) or not isinstance(first, int) or not 1 <= first <= max_page:
        raise BadInput(f"first must be between 1 and {max_page}, not {first}")
    return first


def _key_value(key: InstrumentedAttribute[Any], value: str) -> Any:
    """A cursor part as its key column's type (a uuid key must hold a UUID)."""
    if key.type.python_type is uuid.UUID:
        try:
            return uuid.UUID(value)
        except ValueError:
            raise BadInput("the cursor is not one this API handed out") from None
    return value


def keyset_page(session: Session, stmt: Select[Any], keys: Sequence[InstrumentedAttribute[Any]], *,
                first: int, after: str | None, max_page: int) -> tuple[list[Any], bool, bool]:
    """Up to ``first`` rows of ``stmt`` after the cursor in ``keys`` order (a unique key), whether
    more follow and whether any lie at or before the cursor."""
    check_first(first, max_page)
    page = stmt
    earlier = None
    if after is not None:
        cursor = tuple_(*(literal(_key_value(k, v), type_=k.type) for k, v in
                          zip(keys, decode_cursor(after, len(keys)), strict=True)))
        page = stmt.where(tuple_(*keys) > cursor)
        earlier = stmt.where(tuple_(*keys) <= cursor)
    rows = list(session.execute(page.order_by(*keys).limit(first + 1)).scalars())
    before = earlier is not None and bool(session.execute(select(earlier.exists())).scalar())
    return rows[:first], len(rows) > first, before


def _visible_now() -> ColumnElement[bool]:
    return and_(Document.archived_at.is_(None),
                or_(Document.snoozed_until.is_(None), Document.snoozed_until <= func.now()))


def list_documents(session: Session, identity: Identity, settings: Settings, *, first: int = 20,
                   after: str | None = None, collection: str | None = None, kind: str | None = None,
                   state: str | None = None, include_hidden: bool = False) -> DocumentPage:
    stmt = select(Document)
    if collection is not None:
        stmt = stmt.where(Document.collection == collection)
    if kind is not None:
        stmt = stmt.where(Document.kind == kind)
    if state is not None:
        one_of(state, KNOWN_STATES, "state")
        stmt = stmt.where(Document.state == state)
    if not include_hidden:
        stmt = stmt.where(_visible_now())
    # A path is unique per scope set, so the id breaks ties between documents at one path.
    docs, more, before = keyset_page(session, stmt, (Document.collection, Document.path, Document.id),
                                     first=first, after=after, max_page=settings.api_max_page_size)
    views = _views(session, identity, docs)
    return Page([(encode_cursor(v.collection, v.path, str(v.id)), v) for v in views], more, before)


def get_document(session: Session, identity: Identity, collection: str, path: str
                 ) -> DocumentView | None:
    """The document at ``(collection, path)`` the caller can read (the most recently updated,
    when documents in different scope sets share the path)."""
    here = at_path(session, collection, path)
    return _views(session, identity, here[:1])[0] if here else None


def get_document_by_id(session: Session, identity: Identity, doc_id: uuid.UUID
                       ) -> DocumentView | None:
    doc = session.execute(select(Document).where(Document.id == doc_id)).scalar_one_or_none()
    return _views(session, identity, [doc])[0] if doc is not None else None


def document_by_id(session: Session, identity: Identity, doc_id: uuid.UUID) -> DocumentView:
    """The document with this id; ``NotFound`` when the caller cannot read one (another tenant's
    id gets the same answer as an id that exists nowhere)."""
    view = get_document_by_id(session, identity, doc_id)
    if view is None:
        raise NotFound(f"no document {doc_id} that you can read")
    return view


def upsert_document(session: Session, identity: Identity, doc: DocumentInput, settings: Settings
                    ) -> tuple[PutResult, DocumentView]:
    result = put_document(session, doc, settings)
    view = get_document_by_id(session, identity, result.document_id)
    if view is None:  # written into scopes the caller cannot read back: impossible (write implies read)
        raise Forbidden("the document was written but cannot be read back")
    return result, view


def remove_document(session: Session, collection: str, path: str) -> uuid.UUID:
    return delete_document(session, collection, path)


# The state changes are the lifecycle's (one place decides who may pin, snooze or archive);
# the API answers with the document as it is afterwards.
def pin(session: Session, identity: Identity, doc_id: uuid.UUID, pinned: bool = True) -> DocumentView:
    lifecycle.pin(session, doc_id, pinned)
    return document_by_id(session, identity, doc_id)


def snooze(session: Session, identity: Identity, doc_id: uuid.UUID, until: datetime | None
           ) -> DocumentView:
    lifecycle.snooze_until(session, doc_id, until)
    return document_by_id(session, identity, doc_id)


def archive(session: Session, identity: Identity, doc_id: uuid.UUID, archived: bool = True
            ) -> DocumentView:
    lifecycle.archive(session, doc_id, archived)
    return document_by_id(session, identity, doc_id)
