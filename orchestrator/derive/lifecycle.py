"""Lifecycle: archive documents nobody uses, per collection; pin, snooze, archive, mark used; value.

A policy says "in collection C, archive a document after N days without use".
Use is the latest of the document's last edit (``updated_at``) and its last
``mark used`` (``memory.document_use``, fed by the usage ledger). Pinned
documents are never archived. The sweep sees and archives only what the bound
identity may write, so one user's sweep cannot touch a document shared into a
scope they only read; a dry run and ``apply`` therefore list the same rows.

**Value**: ``memory.value_daily`` (0017) counts, per day and item, the ledger
rows that named it and the ``mark_used`` feedback among them; the usage job
keeps it (``refresh_value`` for yesterday and today). ``value`` ranks the items
the caller can see by their uses over a window, and each sweep item carries its
document's lifetime uses and the days it was used on, so a report shows what an
archive would remove.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import ColumnElement, delete, func, literal, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID, insert
from sqlalchemy.orm import Session

from orchestrator.db.derive_models import DocumentUse, LifecyclePolicy
from orchestrator.db.knowledge_models import UsageEvent, ValueDaily
from orchestrator.db.models import Base, Chunk, Document
from orchestrator.derive import poison
from orchestrator.errors import BadInput, Conflict, Forbidden, NotFound

CHANNELS = ("graphql", "mcp", "python", "cli", "worker")
DOCUMENTS = "sources.documents"


@dataclass(frozen=True)
class Policy:
    collection: str
    archive_after_days: int


@dataclass(frozen=True)
class SweepItem:
    document_id: uuid.UUID
    collection: str
    path: str
    last_used_at: datetime
    archive_after_days: int
    uses: int = 0  # ledger rows that named the document, over its whole life (value_daily)
    days_used: int = 0  # days with at least one such row


@dataclass(frozen=True)
class ItemValue:
    item_table: str
    item_id: uuid.UUID
    uses: int
    marks: int
    days: int
    last_day: date


@dataclass(frozen=True)
class SweepReport:
    as_of: datetime
    items: tuple[SweepItem, ...]
    applied: bool


def set_policy(session: Session, collection: str, archive_after_days: int) -> Policy:
    if not collection or len(collection) > 200:
        raise BadInput("a collection name has 1 to 200 characters")
    if not 1 <= archive_after_days <= 36500:
        raise BadInput("archive_after_days must be between 1 and 36500")
    stmt = insert(LifecyclePolicy).values(collection=collection, archive_after_days=archive_after_days)
    session.execute(stmt.on_conflict_do_update(
        index_elements=[LifecyclePolicy.tenant_id, LifecyclePolicy.collection],
        set_={"archive_after_days": stmt.excluded.archive_after_days}))
    return Policy(collection, archive_after_days)


def remove_policy(session: Session, collection: str) -> bool:
    gone = session.execute(delete(LifecyclePolicy).where(LifecyclePolicy.collection == collection)
                           .returning(LifecyclePolicy.collection)).scalar()
    return gone is not None


def policies(session: Session) -> list[Policy]:
    rows = session.execute(select(LifecyclePolicy.collection, LifecyclePolicy.archive_after_days)
                           .order_by(LifecyclePolicy.collection)).all()
    return [Policy(c, d) for c, d in rows]


def collection_documents(session: Session, collections: Sequence[str]) -> dict[str, int]:
    """How many documents of each of ``collections`` the caller can read, archived ones
    included (a policy over none is likely a misspelt collection)."""
    rows = session.execute(select(Document.collection, func.count())
                           .where(Document.collection.in_(collections))
                           .group_by(Document.collection)).all()
    return dict.fromkeys(collections, 0) | {str(c): int(n) for c, n in rows}


def _writable() -> ColumnElement[bool]:
    # Only rows the caller may write: otherwise a dry run would list documents
    # that --apply could not archive, and the two would disagree.
    mine: ColumnElement[bool] = Document.scopes.contained_by(
        func.auth.write_scopes(type_=ARRAY(UUID(as_uuid=True))))
    return mine


def sweep(session: Session, *, apply: bool = False, as_of: datetime | None = None) -> SweepReport:
    """List (and with ``apply``, archive) the documents past their collection's policy."""
    moment = as_of or datetime.now(UTC)
    if moment.tzinfo is None:
        raise BadInput("as_of needs a time zone")
    last_used = func.greatest(Document.updated_at, func.coalesce(DocumentUse.last_used_at,
                                                                  Document.updated_at))
    cutoff = literal(moment) - func.make_interval(0, 0, 0, LifecyclePolicy.archive_after_days)
    query = (
        select(Document.id, Document.collection, Document.path, last_used.label("last_used_at"),
               LifecyclePolicy.archive_after_days)
        .join(LifecyclePolicy, (LifecyclePolicy.tenant_id == Document.tenant_id)
              & (LifecyclePolicy.collection == Document.collection))
        .outerjoin(DocumentUse, (DocumentUse.tenant_id == Document.tenant_id)
                   & (DocumentUse.document_id == Document.id))
        .where(Document.archived_at.is_(None), Document.pinned.is_(False), _writable(),
               last_used < cutoff)
        .order_by(Document.collection, Document.path)
    )
    if apply:
        # Lock the listed rows so nothing pins or edits them between listing and archiving.
        query = query.with_for_update(of=Document)
    listed = session.execute(query).all()
    worth = _document_value(session, [r[0] for r in listed])
    items = tuple(SweepItem(i, c, p, u, d, *worth.get(i, (0, 0))) for i, c, p, u, d in listed)
    if apply and items and poison.careful():
        # Item by item (poison): a document the database refuses to archive stays as it is,
        # is skipped and shown; the others are archived.
        kept = []
        for it in items:
            with poison.item(session, f"document {it.collection}/{it.path} ({it.document_id})") as done:
                _archive(session, [it.document_id])
            if not done.skipped:
                kept.append(it)
        items = tuple(kept)
    elif apply and items:
        _archive(session, [it.document_id for it in items])
    return SweepReport(moment, items, apply)


def _archive(session: Session, ids: list[uuid.UUID]) -> None:
    done = set(session.execute(update(Document).where(Document.id.in_(ids))
                               .values(archived_at=func.now()).returning(Document.id)).scalars())
    if done != set(ids):
        raise Conflict("the sweep could not archive every listed document; nothing was changed")


def _document_value(session: Session, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[int, int]]:
    """Lifetime uses and days used of each document, from value_daily (as aggregated so far)."""
    if not ids:
        return {}
    rows = session.execute(
        select(ValueDaily.item_id, func.sum(ValueDaily.uses), func.count())
        .where(ValueDaily.item_table == DOCUMENTS, ValueDaily.item_id.in_(ids))
        .group_by(ValueDaily.item_id)).all()
    return {i: (int(u), int(d)) for i, u, d in rows}


def value(session: Session, *, days: int = 30, limit: int = 20, as_of: date | None = None) -> list[ItemValue]:
    """The items the caller can see, most used first over the ``days`` days up to ``as_of`` (today)."""
    if not 1 <= days <= 36500:
        raise BadInput("days must be between 1 and 36500")
    if not 1 <= limit <= 1000:
        raise BadInput("limit must be between 1 and 1000")
    last = as_of or datetime.now(UTC).date()
    rows = session.execute(
        select(ValueDaily.item_table, ValueDaily.item_id, func.sum(ValueDaily.uses).label("uses"),
               func.sum(ValueDaily.marks), func.count(), func.max(ValueDaily.day))
        .where(ValueDaily.day > last - timedelta(days=days), ValueDaily.day <= last)
        .group_by(ValueDaily.item_table, ValueDaily.item_id)
        .order_by(func.sum(ValueDaily.uses).desc(), ValueDaily.item_table, ValueDaily.item_id)
        .limit(limit)).all()
    return [ItemValue(t, i, int(u), int(m), int(n), d) for t, i, u, m, n, d in rows]


def refresh_value(session: Session, day: date) -> int:
    """Recompute the tenant's ``value_daily`` rows of one day (only changed rows); returns how many."""
    return int(session.execute(select(func.memory.refresh_value(day))).scalar_one())


def _document(session: Session, doc_id: uuid.UUID, what: str, *, write: bool) -> None:
    found = session.execute(select(Document.id, _writable()).where(Document.id == doc_id)).first()
    if found is None:
        raise NotFound(f"no document {doc_id} that you can read")
    if write and not found[1]:
        raise Forbidden(f"you may read document {doc_id} but not {what} it: "
                        "that needs write on every scope it is shared into")


def pin(session: Session, doc_id: uuid.UUID, pinned: bool = True) -> None:
    """Pinned documents are boosted in recall and never archived by a sweep."""
    _document(session, doc_id, "pin", write=True)
    session.execute(update(Document).where(Document.id == doc_id).values(pinned=pinned))


def snooze(session: Session, doc_id: uuid.UUID, days: float) -> datetime:
    """Hide a document from recall for ``days`` days; 0 wakes it now. Returns the wake time."""
    if not 0 <= days <= 36500:
        raise BadInput("snooze days must be between 0 and 36500")
    until = datetime.now(UTC) + timedelta(days=days)
    snooze_until(session, doc_id, until if days else None)
    return until


def snooze_until(session: Session, doc_id: uuid.UUID, until: datetime | None) -> None:
    """Hide a document from recall until ``until`` (a moment with a time zone); None wakes it."""
    if until is not None and until.tzinfo is None:
        raise BadInput("snooze needs a moment with a time zone (ISO 8601 with offset or Z)")
    _document(session, doc_id, "snooze", write=True)
    session.execute(update(Document).where(Document.id == doc_id).values(snoozed_until=until))


def archive(session: Session, doc_id: uuid.UUID, archived: bool = True) -> datetime | None:
    """Archive a document by hand (recall hides it, RAPTOR drops it), or bring it back.

    Archiving an archived document keeps its first archive time. Returns the archive
    time, or None after ``archived=False``.
    """
    _document(session, doc_id, "archive" if archived else "unarchive", write=True)
    when: datetime | None = session.execute(
        update(Document).where(Document.id == doc_id)
        .values(archived_at=func.coalesce(Document.archived_at, func.now()) if archived else None)
        .returning(Document.archived_at)).scalar_one()
    return when


def mark_used(session: Session, doc_id: uuid.UUID, *, channel: str = "python") -> None:
    """Feedback that a document helped: one usage-ledger row, which resets its lifecycle clock."""
    if channel not in CHANNELS:
        raise BadInput(f"unknown channel {channel!r}; one of {', '.join(CHANNELS)}")
    # Reading is enough: using a document is not changing it.
    _document(session, doc_id, "use", write=False)
    session.execute(insert(UsageEvent).values(operation="mark_used", channel=channel,
                                              item_table="sources.documents", item_id=doc_id))


def mark_evidence_used(session: Session, items: Sequence[tuple[str, uuid.UUID]] = (), *,
                       claim_ids: Sequence[uuid.UUID] = (), channel: str = "python") -> int:
    """Feedback that served evidence helped: one usage-ledger row per item.

    ``items`` are the ``(item_table, item_id)`` handles recall returns with each
    evidence; ``claim_ids`` is the short form for facts. A source excerpt counts as
    a use of its document (which resets the document's lifecycle clock); a fact
    also counts one access on its claim. Items the caller cannot read are not
    found, and nothing is recorded for any of them. Returns how many items were
    recorded.

    The recalls this process made are in the ledger first (their usage rows are written in
    the background, moments after each recall): feedback sent right after a recall finds its
    event (``rank_training_rows`` labels from a few seconds before the event; migration 0083).
    """
    from orchestrator.recall.service import flush_usage
    from orchestrator.recall.tail import CLAIMS, ITEM_KINDS

    flush_usage(session.get_bind().engine)
    items = [*items, *((CLAIMS, c) for c in claim_ids)]
    if not items:
        raise BadInput("give the items (or claim ids) that were used")
    if channel not in CHANNELS:
        raise BadInput(f"unknown channel {channel!r}; one of {', '.join(CHANNELS)}")
    known = {*ITEM_KINDS, "sources.documents"}
    rows: list[tuple[str, uuid.UUID]] = []
    claims: list[uuid.UUID] = []
    for table, item_id in items:
        if table not in known:
            raise BadInput(f"{table!r} is not a table recall serves; one of {', '.join(sorted(known))}")
        if table == "sources.chunks":
            doc_id = session.execute(select(Chunk.document_id).where(Chunk.id == item_id)).scalar()
            if doc_id is None:
                raise NotFound(f"no excerpt {item_id} that you can read")
            rows.append(("sources.documents", doc_id))
            continue
        t = Base.metadata.tables[table]
        if session.execute(select(t.c.id).where(t.c.id == item_id)).scalar() is None:
            raise NotFound(f"no {table} row {item_id} that you can read")
        rows.append((table, item_id))
        if table == CLAIMS:
            claims.append(item_id)
    if claims:
        session.execute(select(func.knowledge.touch_claims(claims)))
    if rows:
        session.execute(insert(UsageEvent), [
            {"operation": "mark_used", "channel": channel, "item_table": t, "item_id": i}
            for t, i in rows])
    return len(rows)


def aggregate_usage(session: Session, day: date) -> int:
    """Recompute the tenant's ``usage_daily`` rows for one day; returns the rows written."""
    return int(session.execute(select(func.memory.aggregate_usage(day))).scalar_one())
