"""Writing documents: validate, deduplicate by content hash, chunk, queue for embedding.

Every function takes a session from ``bound_session``; what it may write is
decided by row level security, not here. Input is validated first so that a bad
document is refused with a message that names the problem and nothing is
written.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.config import Settings, get_settings
from orchestrator.db.models import Chunk, Document, Scope
from orchestrator.db.session import translate
from orchestrator.errors import BadInput, Forbidden, NotFound
from orchestrator.ingest.aliases import GivenAliases, give_document_aliases
from orchestrator.ingest.chunking import chunk_text
from orchestrator.ingest.values import timestamp
from orchestrator.inputs import name_problem, unix_lines
from orchestrator.markdown import section_trails

KNOWN_STATES = ("Active", "Waiting", "Done", "Someday", "Cancelled", "Archived")


@dataclass(frozen=True)
class DocumentInput:
    collection: str
    path: str
    title: str
    body: str
    scopes: tuple[str, ...]
    kind: str = "note"
    state: str | None = None
    area: str | None = None
    # ``{"extract": false}`` opts the document out of extraction (bring your own claims).
    metadata: dict[str, Any] | None = None
    # When what the document describes happened (front matter ``date``, GraphQL and MCP
    # ``occurredAt``): the timeline lane orders a collection by it. A time zone is required;
    # an ISO 8601 string is read as one.
    occurred_at: datetime | str | None = None


# sources.documents' length checks (migration 0002).
MAX_COLLECTION_CHARS = 200
MAX_PATH_CHARS = 1000


@dataclass(frozen=True)
class PutResult:
    document_id: uuid.UUID
    created: bool
    changed: bool
    chunks: int
    # The text as it was, but what extraction reads with it changed (scopes, metadata: front
    # matter aliases or ``extract``; the title of a note with aliases): its chunks are read
    # again (or withdrawn) with no embedding to wake a worker for them, so the write wakes
    # it (``extract.wake_extraction``, delivered at commit).
    reread: bool = False


def validate(doc: DocumentInput, settings: Settings) -> None:
    problems = []
    for name in ("collection", "path", "title", "body", "kind"):
        value = getattr(doc, name)
        if not isinstance(value, str):
            problems.append(f"{name} must be text, not {type(value).__name__}")
        elif not value.strip():
            problems.append(f"{name} must not be empty")
    # The key (collection, path) as sources.documents' checks hold it (0002), said with its
    # name; one line (it is printed in every item header), and a path names a document inside
    # its collection: no ".." segment.
    for name, limit in (("collection", MAX_COLLECTION_CHARS), ("path", MAX_PATH_CHARS)):
        value = getattr(doc, name)
        if isinstance(value, str) and value.strip():
            found = name_problem(name, value, limit, edge_spaces=True)
            if found:
                problems.append(found)
    if isinstance(doc.path, str) and ".." in doc.path.replace("\\", "/").split("/"):
        problems.append(f"path {doc.path[:200]!r} has a '..' segment: a path names a document "
                        "inside its collection")
    if isinstance(doc.title, str) and len(doc.title) > settings.max_title_chars:
        problems.append(
            f"title is {len(doc.title)} characters; the limit is {settings.max_title_chars}")
    if isinstance(doc.body, str) and len(doc.body) > settings.max_document_chars:
        problems.append(
            f"body is {len(doc.body)} characters; the limit is {settings.max_document_chars}")
    if isinstance(doc.body, str) and "\x00" in doc.body:
        problems.append("body contains a NUL character")
    if doc.state is not None and doc.state not in KNOWN_STATES:
        problems.append(f"state {doc.state!r} is not one of {', '.join(KNOWN_STATES)}")
    try:
        timestamp("occurred_at", doc.occurred_at)
    except BadInput as exc:
        problems.append(exc.message)
    if doc.metadata is not None and not isinstance(doc.metadata, dict):
        problems.append("metadata must be a JSON object")
    elif isinstance(doc.metadata, dict) and not isinstance(doc.metadata.get("extract", True), bool):
        problems.append(f"metadata extract must be true or false (false: never extract entities and "
                        f"claims from this document), not {doc.metadata['extract']!r}")
    if not doc.scopes:
        problems.append("a document must be shared into at least one scope")
    elif not all(isinstance(s, str) and s for s in doc.scopes):
        problems.append("scopes must be non-empty scope names")
    if problems:
        raise BadInput("invalid document: " + "; ".join(problems))


def resolve_scopes(session: Session, names: tuple[str, ...] | list[str]) -> list[uuid.UUID]:
    """Scope names of the bound tenant to ids; unknown names are refused by name."""
    wanted = sorted(set(names))
    rows = session.execute(select(Scope.name, Scope.id).where(Scope.name.in_(wanted))).all()
    found = dict(rows)
    missing = [n for n in wanted if n not in found]
    if missing:
        raise BadInput(f"unknown scope(s) in this tenant: {', '.join(missing)}")
    return [found[n] for n in wanted]


def at_path(session: Session, collection: str, path: str) -> list[Document]:
    """The documents at ``(collection, path)`` the caller can read, most recently updated first.

    A path is unique per scope set (migration 0020): a writer who cannot read a document
    at a path is never told it exists, and its own write there makes another document,
    in its scopes. A reader of both sees both; the first one here is "the document at
    the path" for reads by path."""
    return list(session.execute(
        select(Document).where(Document.collection == collection, Document.path == path)
        .order_by(Document.updated_at.desc(), Document.id)).scalars())


def writable_scope_ids(session: Session) -> set[uuid.UUID]:
    """The ids of the scopes the bound identity may write."""
    return set(session.execute(select(func.auth.write_scopes())).scalar_one() or ())


def _unwritable(session: Session, scope_ids: list[uuid.UUID] | tuple[uuid.UUID, ...],
                writable: set[uuid.UUID]) -> list[str]:
    missing = [s for s in scope_ids if s not in writable]
    if not missing:
        return []
    names = dict(session.execute(select(Scope.id, Scope.name).where(Scope.id.in_(missing))).all())
    return sorted(names.get(s, str(s)) for s in missing)


def put_document(session: Session, doc: DocumentInput, settings: Settings | None = None
                 ) -> PutResult:
    r"""Insert or update the document at ``(collection, path)``.

    Which document: the one the caller can read at that path in exactly the scopes given,
    else the most recently updated one it can read there (then the write moves it into
    the scopes given), else a new one. Unchanged content (same hash, same fields) writes
    nothing (line breaks are ``\n`` first: a body written with ``\r\n`` is the same
    content). Changed content re-chunks the document; its chunks go back on the embedding
    queue. Writing needs write on every scope of the document, before and after:
    ``Forbidden`` names the scopes that are missing.
    """
    settings = settings or get_settings()
    validate(doc, settings)
    if "\r" in doc.body:  # stored, hashed and chunked with \n line breaks (``unix_lines``)
        doc = replace(doc, body=unix_lines(doc.body))
    occurred_at = timestamp("occurred_at", doc.occurred_at)
    scope_ids = resolve_scopes(session, doc.scopes)
    content_hash = hashlib.sha256(doc.body.encode()).digest()
    writable = writable_scope_ids(session)
    denied = _unwritable(session, scope_ids, writable)
    if denied:
        raise Forbidden(f"you may not write into scope(s) {', '.join(denied)}: a document needs "
                        "write on every scope it is shared into", sqlstate="42501")
    lock_path(session, doc.collection, doc.path)
    here = at_path(session, doc.collection, doc.path)
    existing = next((d for d in here if sorted(d.scopes) == sorted(scope_ids)),
                    here[0] if here else None)
    if existing is not None:
        denied = _unwritable(session, existing.scopes, writable)
        if denied:
            raise Forbidden(f"the document at {doc.collection}/{doc.path} is shared into "
                            f"{', '.join(denied)}, which you may read but not write",
                            sqlstate="42501")
    try:
        with session.begin_nested():
            if existing is None:
                # Core inserts name only the columns the app may write; computed
                # columns (hash, tenant, lexical vector) are filled by the server.
                doc_id = session.execute(
                    insert(Document).values(
                        collection=doc.collection, path=doc.path, title=doc.title,
                        body=doc.body, scopes=scope_ids, kind=doc.kind, state=doc.state,
                        area=doc.area, metadata=doc.metadata or {}, occurred_at=occurred_at,
                    ).returning(Document.id)
                ).scalar_one()
                n = _write_chunks(session, doc_id, doc.body, doc.title, settings)
                return PutResult(doc_id, True, True, n)
            same_fields = (
                existing.content_hash == content_hash and existing.title == doc.title
                and sorted(existing.scopes) == sorted(scope_ids) and existing.kind == doc.kind
                and existing.state == doc.state and existing.area == doc.area
                and existing.metadata_ == (doc.metadata or {})
                and existing.occurred_at == occurred_at
            )
            if same_fields:
                return PutResult(existing.id, False, False, 0)
            body_changed = existing.content_hash != content_hash
            metadata = doc.metadata or {}
            reread = not body_changed and (
                sorted(existing.scopes) != sorted(scope_ids) or existing.metadata_ != metadata
                or (existing.title != doc.title
                    and metadata.get("aliases", metadata.get("alias")) not in (None, [])))
            existing.title = doc.title
            existing.body = doc.body
            existing.scopes = scope_ids
            existing.kind = doc.kind
            existing.state = doc.state
            existing.area = doc.area
            existing.metadata_ = doc.metadata or {}
            existing.occurred_at = occurred_at
            session.flush()
            n = 0
            if body_changed:
                session.execute(delete(Chunk).where(Chunk.document_id == existing.id))
                n = _write_chunks(session, existing.id, doc.body, doc.title, settings)
            if reread:  # no embedding will wake a running worker's extraction for these
                from orchestrator.derive.extract import wake_extraction

                wake_extraction(session)
            return PutResult(existing.id, False, True, n, reread)
    except DBAPIError as exc:
        raise translate(exc) from exc


def _write_chunks(session: Session, document_id: uuid.UUID, body: str, title: str,
                  settings: Settings) -> int:
    spans = chunk_text(body, settings.chunk_size_chars, settings.chunk_overlap_chars)
    if spans:
        trails = section_trails(body, [sp.start for sp in spans], title)
        session.execute(insert(Chunk), [
            {"document_id": document_id, "ordinal": sp.ordinal, "text": sp.text,
             "char_start": sp.start, "char_end": sp.end,
             "section": [{"level": level, "text": words} for level, words in trail] or None}
            for sp, trail in zip(spans, trails, strict=True)
        ])
    return len(spans)


def lock_path(session: Session, collection: str, path: str) -> None:
    """Queue behind any other write of ``(collection, path)`` in this tenant until this
    transaction ends. Two writers of a new path (a scheduled ``engram ingest`` and one run by
    hand, two agents) both saw no document there and inserted: the second failed on
    "duplicate key" (41 and 44 of 112 pages in two ingests of one folder at once). The
    second now waits, then finds the first one's document and updates it or leaves it."""
    session.execute(text("select pg_advisory_xact_lock(hashtextextended('engram.document:' || "
                         "auth.tenant_id()::text || ':' || :collection || '/' || :path, 0))"),
                    {"collection": collection, "path": path})


def delete_document(session: Session, collection: str, path: str) -> uuid.UUID:
    """Delete the documents at ``(collection, path)`` the caller may write (one per scope set);
    returns the id of the most recently updated. ``NotFound`` when there is none the caller can
    read there, ``Forbidden`` when there are only ones it may read but not write."""
    lock_path(session, collection, path)
    here = at_path(session, collection, path)
    if not here:
        raise NotFound(f"no document at {collection}/{path} that you can read")
    writable = writable_scope_ids(session)
    mine = [d.id for d in here if set(d.scopes) <= writable]
    if not mine:
        raise Forbidden(f"you may read the document at {collection}/{path} but not delete it: that "
                        "needs write on every scope it is shared into", sqlstate="42501")
    session.execute(delete(Document).where(Document.id.in_(mine)))
    # The aliases their front matter gave entities go with them (where no other note gives
    # them). After the delete: it waits for an extraction reading their chunks, and only then
    # locks the entities that extraction may be locking too.
    give_document_aliases(session, [GivenAliases(d) for d in mine])
    return mine[0]
