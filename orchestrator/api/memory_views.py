"""Reading memory for people who browse it: one claim, keyed facts, derived items, discarding a
quarantined claim, and a row's lineage as far as the caller may read.

Everything runs in the request's ``bound_session`` under forced RLS. The readable lineage is
the one place that needs care beyond RLS: ``provenance.derivations`` is readable tenant-wide
(it holds keys, no content), so the walk keeps only edges whose both ends the caller can read
in their own tables, and never walks through a row it cannot read. What a reader gets is
therefore the lineage of the rows they may see, without the ids or the number of the others.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, aliased

from orchestrator.api.documents import parse_id
from orchestrator.db.knowledge_models import Entity, FactClaim, FactContent, Quarantine
from orchestrator.errors import BadInput, NotFound
from orchestrator.ingest.knowledge import Fact, QuarantineRow, savepoint
from orchestrator.recall.result import ScopeRef

# Tables a readable lineage can name, each with the SQL expression of a short label. Fixed
# here (never from input) because the table name is put into the statement.
LABELS: dict[str, str] = {
    "sources.documents": "t.title",
    "sources.chunks": "t.text",
    "knowledge.entities": "t.canonical_name",
    # Subject, predicate, object: entity names only where the caller can read the entity.
    "knowledge.fact_claim": "concat_ws(' ', coalesce((select e.canonical_name from knowledge.entities e "
                            "where e.tenant_id = t.tenant_id and e.id = t.subject_id), '?'), "
                            "t.predicate, coalesce(t.object_value, (select e.canonical_name "
                            "from knowledge.entities e where e.tenant_id = t.tenant_id "
                            "and e.id = t.object_id), '?'))",
    "knowledge.fact_content": "t.text",
    "memory.working_memory": "t.text",
    "memory.profiles": "t.summary",
    "memory.episodes": "t.summary",
    "memory.observations": "t.text",
    "memory.communities": "t.summary",
    "memory.raptor_nodes": "t.summary",
    "memory.decisions": "t.scenario",
    "memory.decision_links": "t.relation",
}
# Derived memory as the browser lists it: kind -> (table, text column).
DERIVED: dict[str, tuple[str, str]] = {
    "community": ("memory.communities", "summary"),
    "summary": ("memory.raptor_nodes", "summary"),
    "profile": ("memory.profiles", "summary"),
    "episode": ("memory.episodes", "summary"),
    "observation": ("memory.observations", "text"),
    "decision": ("memory.decisions", "scenario"),
}
LABEL_CHARS = 90


def _fact(r: Any, text_: str, object_id: uuid.UUID | None) -> Fact:
    return Fact(id=r.id, text=text_, subject_id=r.subject_id, predicate=r.predicate,
                object_id=object_id, object_value=r.object_value,
                object_datatype=r.object_datatype, epistemic_kind=r.epistemic_kind,
                perspective_key=r.perspective_key, author=r.author, author_role=r.author_role,
                confidence=r.confidence, authority=r.authority, valid_from=r.valid_from,
                valid_to=r.valid_to, recorded_at=r.recorded_at, fact_key=r.fact_key,
                as_of=r.as_of, disputed=r.disputed, beaten_by=None)


# A claim is shown here with its subject's id, so only when the caller may read the subject
# entity too (the inner join runs under the caller's row level security: ``facts(entityId)``
# asks the same); an object entity the caller cannot read is left out (objectId null).
_SUBJECT = aliased(Entity, name="subject_entity")
_OBJECT = aliased(Entity, name="object_entity")


def _readable_entities(stmt: Any, subject: Any, obj: Any) -> Any:
    return (stmt.join(_SUBJECT, (_SUBJECT.tenant_id == subject.tenant_id)
                      & (_SUBJECT.id == subject.subject_id))
            .outerjoin(_OBJECT, (_OBJECT.tenant_id == subject.tenant_id) & (_OBJECT.id == obj)))


def claim(session: Session, claim_id: uuid.UUID) -> Fact | None:
    """One readable claim (current or not) about a readable entity, or None."""
    stmt = (select(FactClaim, FactContent.text, _OBJECT.id)
            .join(FactContent, (FactContent.tenant_id == FactClaim.tenant_id)
                  & (FactContent.id == FactClaim.content_id)))
    row = session.execute(_readable_entities(stmt, FactClaim, FactClaim.object_id)
                          .where(FactClaim.id == claim_id)).one_or_none()
    return None if row is None else _fact(row[0], row[1], row[2])


def keyed_facts(session: Session, *, first: int = 100) -> list[Fact]:
    """The newest readable claim of each fact key (current claims only), by key."""
    from orchestrator.db.knowledge_models import current_claims

    c = current_claims.c
    ranked = select(current_claims, func.row_number().over(
        partition_by=c.fact_key, order_by=(c.as_of.desc(), c.recorded_at.desc(), c.id)
    ).label("n")).where(c.fact_key.is_not(None)).subquery()
    newest = (_readable_entities(select(ranked, _OBJECT.id.label("readable_object_id")),
                                 ranked.c, ranked.c.object_id)
              .where(ranked.c.n == 1).order_by(ranked.c.fact_key).limit(first))
    return [_fact(r, r.text, r.readable_object_id) for r in session.execute(newest)]


@dataclass(frozen=True)
class DerivedItem:
    table: str
    id: uuid.UUID
    kind: str
    text: str
    scopes: list[ScopeRef]
    created_at: datetime | None


def derived_items(session: Session, *, kind: str | None = None, first: int = 50) -> list[DerivedItem]:
    if kind is not None and kind not in DERIVED:
        raise BadInput(f"unknown derived kind {kind!r}; use one of {', '.join(DERIVED)}")
    names = {sid: (name, desc) for sid, name, desc in session.execute(
        text("select id, name, description from auth.scopes"))}
    out: list[DerivedItem] = []
    for k, (table, column) in DERIVED.items():
        if kind is not None and k != kind:
            continue
        for r in session.execute(text(
                f"select id, {column} as body, scopes, created_at from {table} "
                "order by created_at desc, id limit :n"), {"n": first}):
            scopes = sorted((ScopeRef(*names[s]) for s in r.scopes if s in names),
                            key=lambda s: s.name)
            out.append(DerivedItem(table, r.id, k, r.body or "", scopes, r.created_at))
    out.sort(key=lambda d: (d.created_at is None, -(d.created_at.timestamp()
                                                     if d.created_at else 0), str(d.id)))
    return out[:first]


def discard_quarantine(session: Session, quarantine_id: uuid.UUID) -> QuarantineRow:
    """Mark a held quarantined claim discarded (kept for the record). Not readable or not held:
    ``NotFound``; readable but not writable: the database's refusal."""
    with savepoint(session):
        row = session.execute(select(Quarantine).where(Quarantine.id == quarantine_id)
                              ).scalar_one_or_none()
        if row is None or row.status != "held":
            raise NotFound(f"no held quarantine entry {quarantine_id}")
        done = session.execute(
            text("update knowledge.quarantine set status = 'discarded' "
                 "where id = :q and status = 'held' returning id"), {"q": quarantine_id}).scalar()
        if done is None:
            from orchestrator.errors import Forbidden

            raise Forbidden(f"quarantine entry {quarantine_id} needs write on all of its scopes")
        session.refresh(row)
    return QuarantineRow(row.id, row.shape_id, tuple(row.reasons), row.payload, row.status,
                         row.released_claim_id)


@dataclass(frozen=True)
class ReadableNode:
    table: str
    id: str
    label: str


@dataclass(frozen=True)
class ReadableEdge:
    relation: str
    derived_table: str
    derived_id: str
    source_table: str
    source_id: str
    depth: int


@dataclass(frozen=True)
class ReadableLineage:
    nodes: list[ReadableNode]
    edges: list[ReadableEdge]


def _labels(session: Session, table: str, ids: list[str]) -> dict[str, str]:
    """Labels of the rows of ``table`` the caller can read, by id (unreadable ids are absent)."""
    expr = LABELS.get(table)
    if expr is None or not ids:
        return {}
    rows = session.execute(text(f"select cast(t.id as text) as id, {expr} as label from {table} t "
                                "where t.id = any(cast(:ids as uuid[]))"), {"ids": ids})
    out = {}
    for r in rows:
        label = " ".join(str(r.label or "").split())
        out[r.id] = label[:LABEL_CHARS] + ("..." if len(label) > LABEL_CHARS else "")
    return out


def readable_lineage(session: Session, table: str, row_id: str, *, direction: str = "back",
                     max_depth: int = 5) -> ReadableLineage:
    """Breadth first over ``provenance.derivations`` from one row, readable rows only. A
    document's forward walk starts from its chunks as well (they are its parts, not derived)."""
    if direction not in ("back", "forward"):
        raise BadInput("direction is back or forward")
    if not 1 <= max_depth <= 20:
        raise BadInput("maxDepth must be between 1 and 20")
    if table not in LABELS:
        raise BadInput(f"no lineage for table {table!r}; use one of {', '.join(sorted(LABELS))}")
    start = str(parse_id(row_id, "row"))
    found = _labels(session, table, [start])
    if start not in found:
        raise NotFound(f"{table} {start} does not exist or is not visible")
    nodes: dict[tuple[str, str], ReadableNode] = {(table, start): ReadableNode(table, start,
                                                                               found[start])}
    edges: list[ReadableEdge] = []
    frontier = [(table, start)]
    if table == "sources.documents" and direction == "forward":
        chunks = [str(c) for c in session.execute(text(
            "select id from sources.chunks where document_id = :d order by ordinal"),
            {"d": start}).scalars()]
        for cid, label in _labels(session, "sources.chunks", chunks).items():
            nodes[("sources.chunks", cid)] = ReadableNode("sources.chunks", cid, label)
            edges.append(ReadableEdge("hasPart", "sources.chunks", cid, table, start, 1))
            frontier.append(("sources.chunks", cid))
    offset = int(len(frontier) > 1)  # a document's chunks are the first step of its forward walk
    near = "derived" if direction == "back" else "source"
    for depth in range(1, max_depth + 1):
        if not frontier:
            break
        rows = session.execute(text(f"""
            select distinct d.relation, d.derived_table, d.derived_row_id ->> 'id' as derived_id,
                   d.source_table, d.source_row_id ->> 'id' as source_id
              from provenance.derivations d
              join unnest(cast(:tables as text[]), cast(:ids as text[])) as f(tbl, id)
                on d.{near}_table = f.tbl and d.{near}_row_id = jsonb_build_object('id', f.id)
             where d.source_table is not null"""),
            {"tables": [t for t, _ in frontier], "ids": [i for _, i in frontier]}).all()
        wanted: dict[str, list[str]] = {}
        for r in rows:
            t, i = (r.source_table, r.source_id) if direction == "back" else (r.derived_table,
                                                                               r.derived_id)
            if i is not None and (t, i) not in nodes:
                wanted.setdefault(t, []).append(i)
        readable: dict[tuple[str, str], str] = {}
        for t, ids in wanted.items():
            for i, label in _labels(session, t, sorted(set(ids))).items():
                readable[(t, i)] = label
        frontier = []
        for r in rows:
            far_key = (r.source_table, r.source_id) if direction == "back" else (r.derived_table,
                                                                                  r.derived_id)
            if far_key not in nodes:
                if far_key not in readable:
                    continue  # not readable (or not a table with an id): left out, not walked
                nodes[far_key] = ReadableNode(far_key[0], far_key[1], readable[far_key])
                frontier.append(far_key)
            edges.append(ReadableEdge(r.relation, r.derived_table, r.derived_id, r.source_table,
                                      r.source_id, depth + offset))
    return ReadableLineage(list(nodes.values()), edges)


def quarantine_extra(session: Session, quarantine_id: uuid.UUID) -> tuple[datetime | None, str | None]:
    row = session.execute(select(Quarantine.created_at, Quarantine.author)
                          .where(Quarantine.id == quarantine_id)).one_or_none()
    return (row[0], row[1]) if row else (None, None)


def conflict_detected_at(session: Session, conflict_id: uuid.UUID) -> datetime | None:
    from orchestrator.db.knowledge_models import FactConflict

    found: datetime | None = session.execute(
        select(FactConflict.detected_at).where(FactConflict.id == conflict_id)).scalar()
    return found
