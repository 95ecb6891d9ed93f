"""Writing and reading knowledge: entities, facts, keyed facts, relations, conflicts, quarantine.

The database owns every rule (see ``db/versions/0004_knowledge.py``): scopes,
shapes, perspectives, conflict detection and resolution run in SQL under the
bound identity's row level security. This module is the thin typed layer over
it. It validates what Python can see before a round trip (types, ranges, date
formats) so that a bad call is refused with a message naming the problem, and
every write runs in a savepoint: a refused write leaves nothing behind and the
caller's session stays usable.

A claim that fails a shape is not an error: ``assert_fact`` returns an
``AssertResult`` with ``quarantine_id`` and the reasons, because the claim is
kept (in quarantine) and can be released after correction.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal

from sqlalchemy import func, insert, select, text, tuple_
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.db.knowledge_models import (
    Entity,
    FactClaim,
    FactConflict,
    Quarantine,
    effective_claims,
)
from orchestrator.db.session import translate
from orchestrator.errors import BadInput, Conflict, NotFound
from orchestrator.ingest.documents import resolve_scopes
from orchestrator.ingest.values import timestamp
from orchestrator.inputs import one_of

EpistemicKind = Literal["world_fact", "experience", "observation", "opinion", "preference"]
Strategy = Literal["newest_wins", "highest_authority_wins", "keep_both", "manual"]
Literal_ = str | bool | int | float | date | datetime

EPISTEMIC_KINDS = ("world_fact", "experience", "observation", "opinion", "preference")
STRATEGIES = ("newest_wins", "highest_authority_wins", "keep_both", "manual")
DATATYPES = ("string", "number", "integer", "boolean", "date", "datetime", "uri")
CONFLICT_STATUSES = ("open", "resolved", "disputed")  # knowledge.conflict_status (0004)
QUARANTINE_STATUSES = ("held", "released", "discarded")  # ck_quarantine_status_known (0004)
_PREDICATE = re.compile(r"^[a-z][a-z0-9_:.-]{0,99}$")


@dataclass(frozen=True)
class FactInput:
    """One claim. Exactly one of ``value`` (a literal) and ``object_id`` (an entity)."""

    subject_id: uuid.UUID
    predicate: str
    text: str
    scopes: tuple[str, ...]
    value: Literal_ | None = None
    object_id: uuid.UUID | None = None
    datatype: str | None = None
    kind: EpistemicKind = "world_fact"
    author_role: str = "user"
    confidence: float = 1.0
    authority: int = 0
    valid_from: datetime | str | None = None
    valid_to: datetime | str | None = None
    fact_key: str | None = None
    as_of: datetime | str | None = None


@dataclass(frozen=True)
class AssertResult:
    claim_id: uuid.UUID | None
    quarantine_id: uuid.UUID | None = None
    reasons: tuple[str, ...] = ()

    @property
    def quarantined(self) -> bool:
        return self.quarantine_id is not None


@dataclass(frozen=True)
class Fact:
    id: uuid.UUID
    text: str
    subject_id: uuid.UUID
    predicate: str
    object_id: uuid.UUID | None
    object_value: str | None
    object_datatype: str
    epistemic_kind: str
    perspective_key: str
    author: str
    author_role: str
    confidence: float
    authority: int
    valid_from: datetime | None
    valid_to: datetime | None
    recorded_at: datetime
    fact_key: str | None
    as_of: datetime | None
    disputed: bool
    beaten_by: uuid.UUID | None


@dataclass(frozen=True)
class ConflictRow:
    id: uuid.UUID
    kind: str
    claim_a: uuid.UUID
    claim_b: uuid.UUID
    subject_id: uuid.UUID
    predicate: str
    perspective_key: str
    status: str
    strategy: str | None
    winner_id: uuid.UUID | None


@dataclass(frozen=True)
class ShapeViolation:
    claim_id: uuid.UUID | None
    subject_id: uuid.UUID
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class QuarantineRow:
    id: uuid.UUID
    shape_id: uuid.UUID | None
    reasons: tuple[str, ...]
    payload: dict[str, Any] = field(hash=False)
    status: str = "held"
    released_claim_id: uuid.UUID | None = None


@contextmanager
def savepoint(session: Session) -> Iterator[None]:
    """Run a write in a savepoint; a database refusal becomes an EngramError, nothing stays."""
    try:
        with session.begin_nested():
            yield
    except DBAPIError as exc:
        raise translate(exc) from exc


def literal_value(value: Literal_, datatype: str | None) -> tuple[str, str]:
    """A Python value as the (text, datatype) pair a claim stores."""
    one_of(datatype, DATATYPES, "datatype")
    if isinstance(value, bool):
        inferred, textual = "boolean", "true" if value else "false"
    elif isinstance(value, int):
        inferred, textual = "integer", str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise BadInput(f"value {value!r} is not a finite number")
        inferred, textual = "number", repr(value)
    elif isinstance(value, datetime):
        if value.tzinfo is None:
            raise BadInput(f"value {value.isoformat()} has no time zone")
        inferred, textual = "datetime", value.isoformat()
    elif isinstance(value, date):
        inferred, textual = "date", value.isoformat()
    elif isinstance(value, str):
        inferred, textual = "string", value
    else:
        raise BadInput(f"value of type {type(value).__name__} cannot be stored in a claim")
    if datatype is None or datatype == inferred:
        return textual, inferred
    if inferred != "string":
        raise BadInput(f"value {textual!r} is a {inferred}, not a {datatype}")
    # A string with an explicit datatype: the database checks the format.
    return textual, datatype


def _validate(fact: FactInput) -> tuple[datetime | None, datetime | None, datetime | None]:
    problems = []
    if not isinstance(fact.predicate, str) or not _PREDICATE.match(fact.predicate):
        problems.append(f"predicate {fact.predicate!r} must be lower case letters, digits and _:.-")
    if not isinstance(fact.text, str) or not fact.text.strip():
        problems.append("text must not be empty")
    if (fact.value is None) == (fact.object_id is None):
        problems.append("a claim has exactly one object: a value or an entity")
    if fact.kind not in EPISTEMIC_KINDS:
        problems.append(f"kind {fact.kind!r} is not one of {', '.join(EPISTEMIC_KINDS)}")
    if isinstance(fact.confidence, bool) or not isinstance(fact.confidence, (int, float)) or \
            not 0.0 <= float(fact.confidence) <= 1.0:
        problems.append(f"confidence {fact.confidence!r} is outside [0, 1]")
    if isinstance(fact.authority, bool) or not isinstance(fact.authority, int) or \
            not 0 <= fact.authority <= 100:
        problems.append(f"authority {fact.authority!r} is outside 0..100")
    if not fact.scopes:
        problems.append("a claim must be shared into at least one scope")
    if (fact.fact_key is None) != (fact.as_of is None):
        problems.append("a keyed fact needs both fact_key and as_of")
    if problems:
        raise BadInput("invalid claim: " + "; ".join(problems))
    valid_from = timestamp("valid_from", fact.valid_from)
    valid_to = timestamp("valid_to", fact.valid_to)
    as_of = timestamp("as_of", fact.as_of)
    if valid_from is not None and valid_to is not None and valid_to <= valid_from:
        raise BadInput(f"invalid claim: valid_to {valid_to.isoformat()} is not after valid_from "
                       f"{valid_from.isoformat()}")
    return valid_from, valid_to, as_of


def visible_ids(session: Session, table: Any, ids: Sequence[uuid.UUID | None]) -> set[uuid.UUID]:
    """The ids among ``ids`` of rows the bound identity can read. A readable row may refer to
    one it cannot (a claim's object entity in another scope): such a reference is shown as
    null, never as the other row's id."""
    wanted = {i for i in ids if i is not None}
    if not wanted:
        return set()
    return set(session.execute(select(table.id).where(table.id.in_(wanted))).scalars())


def require_visible(session: Session, table: Any, ids: Sequence[uuid.UUID], what: str) -> None:
    """Refuse ids the bound identity cannot see (another tenant's, another scope's) as not
    found: the answer is the same whether the row exists elsewhere or nowhere."""
    wanted = {i for i in ids if i is not None}
    if not wanted:
        return
    seen = set(session.execute(select(table.id).where(table.id.in_(wanted))).scalars())
    for missing in sorted(wanted - seen, key=str):
        raise NotFound(f"{what} {missing} does not exist in this tenant or is not visible")


def key_moment(value: datetime | None) -> str:
    return value.isoformat() if value is not None else "-"


def _refuse_taken_keys(session: Session, keys: list[tuple[str, datetime]]) -> None:
    """A keyed snapshot ``(fact_key, as_of)`` is one claim among those the writer can read.

    The database's key is per scope set (migration 0020), so a claim the writer cannot
    read never collides and is never revealed; one it can read, in any scope set, is
    refused here as a conflict, as is the same key and moment twice in one batch."""
    if not keys:
        return
    seen: set[tuple[str, datetime]] = set()
    for key in keys:
        if key in seen:
            raise Conflict(f"keyed fact {key[0]!r} as of {key_moment(key[1])} is given twice")
        seen.add(key)
    taken = session.execute(
        select(FactClaim.fact_key, FactClaim.as_of, FactClaim.id)
        .where(tuple_(FactClaim.fact_key, FactClaim.as_of).in_(keys))
        .order_by(FactClaim.fact_key, FactClaim.as_of, FactClaim.id)).first()
    if taken is not None:
        raise Conflict(f"keyed fact {taken[0]!r} as of {key_moment(taken[1])} already exists "
                       f"(claim {taken[2]}): a snapshot is one claim; give another as_of")


def assert_fact(session: Session, fact: FactInput) -> AssertResult:
    """Assert a claim; it lands, or it is quarantined with the reasons, or it is refused."""
    return assert_facts(session, [fact])[0]


# What identifies a claim row among those one batch wrote: every column the caller gave,
# with subject and object after merges (the claim trigger stores canonical entities).
_ClaimKey = tuple[Any, ...]


def _claim_key(content_id: Any, subject: Any, predicate: str, object_id: Any, object_value: str | None,
               datatype: str, kind: str, confidence: float, authority: int, valid_from: Any,
               valid_to: Any, fact_key: str | None, as_of: Any, scopes: Sequence[Any]) -> _ClaimKey:
    def moment(v: Any) -> datetime | None:
        return datetime.fromisoformat(v) if isinstance(v, str) else v

    def ident(v: Any) -> uuid.UUID | None:
        return uuid.UUID(v) if isinstance(v, str) else v

    return (ident(content_id), ident(subject), predicate, ident(object_id), object_value, datatype, kind,
            round(float(confidence), 9), int(authority), moment(valid_from), moment(valid_to), fact_key,
            moment(as_of), tuple(sorted(str(s) for s in scopes)))


def assert_facts(session: Session, facts: Sequence[FactInput]) -> list[AssertResult]:
    """Assert many claims in a handful of round trips; one result per fact, in order.

    The same rules as one claim at a time: every fact is validated first (one bad
    fact refuses the batch and writes nothing), entities must be visible, each claim
    passes the shape checks of the claim trigger or is quarantined with the reasons.
    Texts are interned in one statement (``knowledge.intern_contents``) and the claims
    inserted in one multi-row statement (the provenance chain appends once per
    statement, not per claim).
    """
    if not facts:
        return []
    prepared = []
    for fact in facts:
        valid_from, valid_to, as_of = _validate(fact)
        object_value, datatype = (None, "entity") if fact.value is None else \
            literal_value(fact.value, fact.datatype)
        prepared.append((fact, valid_from, valid_to, as_of, object_value, datatype))
    _refuse_taken_keys(session, [(f.fact_key, as_of) for f, _, _, as_of, _, _ in prepared
                                 if f.fact_key is not None and as_of is not None])
    entity_ids = {i for f in facts for i in (f.subject_id, f.object_id) if i is not None}
    canonical: dict[uuid.UUID, uuid.UUID] = {r[0]: r[1] for r in session.execute(
        select(Entity.id, func.knowledge.canonical_entity(Entity.id)).where(Entity.id.in_(entity_ids)))}
    for missing in sorted(entity_ids - set(canonical), key=str):
        raise NotFound(f"entity {missing} does not exist in this tenant or is not visible")
    names = sorted({n for f in facts for n in f.scopes})
    scope_of = dict(zip(names, resolve_scopes(session, names), strict=True))
    results: list[AssertResult | None] = [None] * len(facts)
    with savepoint(session):
        texts = list(dict.fromkeys(f.text for f in facts))
        content: dict[str, uuid.UUID] = {r[0]: r[1] for r in session.execute(text(
            "select content_text, content_id from knowledge.intern_contents(cast(:t as text[]))"),
            {"t": texts})}
        rows, waiting = [], defaultdict(list)
        for i, (f, valid_from, valid_to, as_of, object_value, datatype) in enumerate(prepared):
            scope_ids = sorted({scope_of[n] for n in f.scopes}, key=str)
            rows.append({
                "content_id": content[f.text], "subject_id": f.subject_id, "predicate": f.predicate,
                "object_id": f.object_id, "object_value": object_value, "object_datatype": datatype,
                "scopes": scope_ids, "epistemic_kind": f.kind, "author_role": f.author_role,
                "confidence": float(f.confidence), "authority": f.authority, "valid_from": valid_from,
                "valid_to": valid_to, "fact_key": f.fact_key, "as_of": as_of})
            waiting[_claim_key(content[f.text], canonical[f.subject_id], f.predicate,
                               canonical.get(f.object_id) if f.object_id else None, object_value,
                               datatype, f.kind, f.confidence, f.authority, valid_from, valid_to,
                               f.fact_key, as_of, scope_ids)].append(i)
        c = FactClaim
        landed = session.execute(insert(FactClaim).returning(
            c.id, c.content_id, c.subject_id, c.predicate, c.object_id, c.object_value, c.object_datatype,
            c.epistemic_kind, c.confidence, c.authority, c.valid_from, c.valid_to, c.fact_key, c.as_of,
            c.scopes), rows).all()
        for r in landed:
            slot = waiting.get(_claim_key(
                r.content_id, r.subject_id, r.predicate, r.object_id, r.object_value, r.object_datatype,
                r.epistemic_kind, r.confidence, r.authority, r.valid_from, r.valid_to, r.fact_key, r.as_of,
                r.scopes))
            if slot:
                results[slot.pop(0)] = AssertResult(r.id)
        if any(slot for slot in waiting.values()):
            # Diverted by a shape into quarantine: this transaction's newest rows of this
            # writer are this statement's (ids are time-ordered).
            held = session.execute(
                select(Quarantine.id, Quarantine.reasons, Quarantine.payload)
                .where(Quarantine.created_at == func.now(), Quarantine.author == func.auth.user_id(),
                       Quarantine.status == "held")
                .order_by(Quarantine.id.desc())).all()
            for qid, reasons, p in held:
                slot = waiting.get(_claim_key(
                    p.get("content_id"), p.get("subject_id"), p.get("predicate"), p.get("object_id"),
                    p.get("object_value"), p.get("object_datatype"), p.get("epistemic_kind"),
                    p.get("confidence"), p.get("authority"), p.get("valid_from"), p.get("valid_to"),
                    p.get("fact_key"), p.get("as_of"), p.get("scopes") or []))
                if slot:
                    results[slot.pop()] = AssertResult(None, qid, tuple(reasons))
    if any(r is None for r in results):
        raise BadInput("a claim was neither stored nor quarantined")
    return [r for r in results if r is not None]


def retract_claims(session: Session, claim_ids: Sequence[uuid.UUID]) -> int:
    """End the record time of claims whose source no longer says them (``superseded_at``).

    Nothing is deleted: a retracted claim stays in the history (and in lineage), it is
    just no longer current, so recall and consolidation stop serving it. Only claims the
    caller may write are touched; returns how many were retracted now.
    """
    if not claim_ids:
        return 0
    with savepoint(session):
        done = session.execute(text(
            "update knowledge.fact_claim set superseded_at = now() "
            "where id = any(cast(:ids as uuid[])) and superseded_at is null"), {"ids": list(claim_ids)})
    return int(getattr(done, "rowcount", 0) or 0)


def assert_keyed_fact(session: Session, fact: FactInput, *, fact_key: str,
                      as_of: datetime | str, authority: int) -> AssertResult:
    """A keyed snapshot: the newest ``as_of`` per key is current and outranks prose."""
    if not isinstance(fact_key, str) or not 1 <= len(fact_key) <= 200:
        raise BadInput("fact_key must be 1 to 200 characters")
    return assert_fact(session, FactInput(**{**fact.__dict__, "fact_key": fact_key,
                                             "as_of": as_of, "authority": authority}))


def assert_relation(session: Session, subject_id: uuid.UUID, predicate: str,
                    object_id: uuid.UUID, text_: str, scopes: Sequence[str],
                    **options: Any) -> AssertResult:
    """A claim whose object is an entity: an edge of the graph."""
    return assert_fact(session, FactInput(subject_id=subject_id, predicate=predicate, text=text_,
                                          scopes=tuple(scopes), object_id=object_id, **options))


# --- entities ------------------------------------------------------------------------


def resolve_entity(session: Session, entity_type: str, name: str, scopes: Sequence[str] = (),
                   *, create: bool = True) -> uuid.UUID | None:
    """The entity of this type named (or aliased) ``name``, normalised; created when missing."""
    if not isinstance(name, str) or not name.strip():
        raise BadInput("an entity name must not be empty")
    if create and not scopes:
        raise BadInput("a new entity must be shared into at least one scope")
    scope_ids = resolve_scopes(session, tuple(scopes)) if scopes else []
    with savepoint(session):
        found: uuid.UUID | None = session.execute(select(func.knowledge.resolve_entity(
            entity_type, name, scope_ids, create))).scalar_one()
        return found


def add_aliases(session: Session, entity_id: uuid.UUID, aliases: Sequence[str]) -> None:
    with savepoint(session):
        done = session.execute(text(
            "update knowledge.entities set aliases = aliases || cast(:a as text[]) "
            "where id = :id returning id"), {"a": list(aliases), "id": entity_id}).first()
    if done is None:
        raise BadInput(f"entity {entity_id} is not visible or not writable")


def merge_entities(session: Session, survivor: uuid.UUID, merged: uuid.UUID) -> uuid.UUID:
    """Merge ``merged`` into ``survivor``; the merged-away id keeps resolving."""
    with savepoint(session):
        result: uuid.UUID = session.execute(
            select(func.knowledge.merge_entities(survivor, merged))).scalar_one()
        return result


def canonical_entity(session: Session, entity_id: uuid.UUID) -> uuid.UUID | None:
    found: uuid.UUID | None = session.execute(
        select(func.knowledge.canonical_entity(entity_id))).scalar_one()
    return found


# --- reads ---------------------------------------------------------------------------


def current_facts(session: Session, entity_id: uuid.UUID, *, include_beaten: bool = False,
                  limit: int | None = None) -> list[Fact]:
    """Current claims about an entity (merges followed), keyed facts applied; at most ``limit``.

    An entity the caller cannot see is ``NotFound``, whether it exists elsewhere or nowhere."""
    subject = canonical_entity(session, entity_id)
    if subject is None:
        raise NotFound(f"entity {entity_id} does not exist in this tenant or is not visible")
    c = effective_claims.c
    stmt = select(effective_claims).where(c.subject_id == subject).order_by(
        c.predicate, c.recorded_at, c.id).limit(limit)
    if not include_beaten:
        stmt = stmt.where(c.beaten_by.is_(None))
    rows = session.execute(stmt).all()
    objects = visible_ids(session, Entity, [r.object_id for r in rows])
    return [Fact(id=r.id, text=r.text, subject_id=r.subject_id, predicate=r.predicate,
                 object_id=r.object_id if r.object_id in objects else None,
                 object_value=r.object_value,
                 object_datatype=r.object_datatype, epistemic_kind=r.epistemic_kind,
                 perspective_key=r.perspective_key, author=r.author, author_role=r.author_role,
                 confidence=r.confidence, authority=r.authority, valid_from=r.valid_from,
                 valid_to=r.valid_to, recorded_at=r.recorded_at, fact_key=r.fact_key,
                 as_of=r.as_of, disputed=r.disputed, beaten_by=r.beaten_by)
            for r in rows]


def conflicts(session: Session, *, status: str | None = None, limit: int | None = None
              ) -> list[ConflictRow]:
    """Conflicts the caller can read, oldest first; at most ``limit``."""
    stmt = select(FactConflict).order_by(FactConflict.detected_at, FactConflict.id).limit(limit)
    one_of(status, CONFLICT_STATUSES)
    if status is not None:
        stmt = stmt.where(FactConflict.status == status)
    return [ConflictRow(r.id, r.kind, r.claim_a, r.claim_b, r.subject_id, r.predicate,
                        r.perspective_key, r.status, r.strategy, r.winner_id)
            for r in session.execute(stmt).scalars()]


def detect_conflicts(session: Session) -> int:
    """Sweep the whole tenant (what the caller can read); returns how many conflicts are new."""
    with savepoint(session):
        found: int = session.execute(select(func.knowledge.detect_conflicts())).scalar_one()
        return found


def resolve_conflict(session: Session, conflict_id: uuid.UUID, strategy: Strategy,
                     winner: uuid.UUID | None = None) -> uuid.UUID | None:
    """Resolve with a strategy; returns the winning claim (None for keep_both)."""
    one_of(strategy, STRATEGIES, "strategy")
    if strategy == "manual" and winner is None:
        raise BadInput("a manual resolution names the winning claim")
    # An unreadable conflict is the database's NotFound (P0002); an unreadable winner is too.
    require_visible(session, FactClaim, [winner] if winner else [], "claim")
    with savepoint(session):
        result: uuid.UUID | None = session.execute(
            text("select knowledge.resolve_conflict(:c, cast(:s as knowledge.resolution_strategy), :w)"),
            {"c": conflict_id, "s": strategy, "w": winner}).scalar_one()
        return result


def quarantine(session: Session, *, status: str | None = "held", limit: int | None = None
               ) -> list[QuarantineRow]:
    """Quarantined claims the caller wrote or can read, oldest first; at most ``limit``."""
    stmt = select(Quarantine).order_by(Quarantine.created_at, Quarantine.id).limit(limit)
    one_of(status, QUARANTINE_STATUSES)
    if status is not None:
        stmt = stmt.where(Quarantine.status == status)
    rows = list(session.execute(stmt).scalars())
    refs = ("subject_id", "object_id")
    entities = {str(i) for i in visible_ids(session, Entity, [
        _uuid_or_none(r.payload.get(k)) for r in rows for k in refs])}
    claims = visible_ids(session, FactClaim, [r.released_claim_id for r in rows])
    return [QuarantineRow(r.id, r.shape_id, tuple(r.reasons),
                          {**r.payload, **{k: None for k in refs
                                           if r.payload.get(k) is not None
                                           and str(r.payload.get(k)) not in entities}},
                          r.status, r.released_claim_id if r.released_claim_id in claims else None)
            for r in rows]


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except ValueError:
        return None


def release_quarantine(session: Session, quarantine_id: uuid.UUID,
                       corrections: dict[str, Any] | None = None) -> AssertResult:
    """Retry a quarantined claim with corrections; still failing keeps it held (new reasons)."""
    allowed = {"object_value", "object_id", "object_datatype", "predicate", "subject_id",
               "valid_from", "valid_to", "confidence", "authority", "epistemic_kind"}
    if corrections is not None and not isinstance(corrections, dict):
        raise BadInput("corrections are a JSON object of claim fields")
    unknown = sorted(set(corrections or {}) - allowed)
    if unknown:
        raise BadInput(f"cannot correct {', '.join(unknown)}; correctable: {', '.join(sorted(allowed))}")
    with savepoint(session):
        claim_id = session.execute(
            text("select knowledge.release_quarantine(:q, cast(:p as jsonb))"),
            {"q": quarantine_id, "p": json.dumps(corrections or {}, default=str)}).scalar_one()
    if claim_id is not None:
        return AssertResult(claim_id)
    reasons = session.execute(select(Quarantine.reasons).where(Quarantine.id == quarantine_id)
                              ).scalar_one()
    return AssertResult(None, quarantine_id, tuple(reasons))


def touch_facts(session: Session, claim_ids: Sequence[uuid.UUID]) -> int:
    """Count one access for each claim recall selected (readers included)."""
    counted: int = session.execute(select(func.knowledge.touch_claims(list(claim_ids)))).scalar_one()
    return counted


def dry_run_shape(session: Session, predicate: str, *, subject_type: str | None = None,
                  object_type: str | None = None, datatype: str | None = None,
                  min_count: int | None = None, max_count: int | None = None,
                  value_pattern: str | None = None, allowed_values: Sequence[str] | None = None
                  ) -> list[ShapeViolation]:
    """What a proposed shape for ``predicate`` would reject among the claims the caller reads.

    Changes nothing: the report comes from the same check functions the trigger uses.
    """
    if not isinstance(predicate, str) or not _PREDICATE.match(predicate):
        raise BadInput(f"predicate {predicate!r} must be lower case letters, digits and _:.-")
    with savepoint(session):
        rows = session.execute(text(
            "select claim_id, subject_id, reasons from knowledge.dry_run_shape("
            ":p, :st, :ot, :dt, :mn, :mx, :vp, cast(:av as text[]))"),
            {"p": predicate, "st": subject_type, "ot": object_type, "dt": datatype, "mn": min_count,
             "mx": max_count, "vp": value_pattern,
             "av": list(allowed_values) if allowed_values is not None else None}).all()
    return [ShapeViolation(r.claim_id, r.subject_id, tuple(r.reasons)) for r in rows]
