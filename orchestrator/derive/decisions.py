"""Decision hooks: items marked as decisions become ``memory.decisions`` records with causal links.

Two kinds of item are marked as decisions:

* a **working-memory item** with ``kind = 'decision'`` (``add_working_memory(...,
  kind="decision", category=...)``, ``engram remember --decision``). Its text is
  the scenario; a ``because`` in it splits off the reasoning (otherwise the
  reasoning says who marked it in which session). ``decided_at`` is the item's
  time, ``decided_by`` its user, the category the item's (default ``general``).
  **Scopes:** working memory is private to its user, but marking an item as a
  decision is an explicit act of recording it: the decision is shared into the
  item's scopes, so everyone who reads those scopes sees it (the item itself
  stays private).
* a **document** with ``kind: decision`` in its front matter. The title is the
  scenario and the body the reasoning; front matter may add ``category``,
  ``outcome``, ``confidence`` (0..1), ``decided_at`` (ISO date or time; else the
  document's ``occurred_at``, else when it was first stored), and
  ``caused_by`` / ``influenced_by``: paths of other decision documents (in the
  same collection, or ``collection/path``). The decision carries the document's
  scopes and author. When the document changes later, the decision's outcome,
  confidence and scopes follow it; scenario and reasoning are the record of the
  moment and stay.

``source_table`` / ``source_id`` (unique per tenant) make the hook idempotent:
an item already recorded is never recorded again.

Causal links (``memory.decision_links``), each shared into the scopes its two
decisions have in common (so a reader of the link can read both ends; when they
share none, no link is written and the report says so):

* ``precedent_for``: from the latest earlier decision of the same category that
  shares a scope with the new one, made when a decision is first recorded;
* ``caused`` / ``influenced``: from the decision of each ``caused_by`` /
  ``influenced_by`` document to this one. A reference that does not resolve yet
  (the other document is not ingested, or not a decision) is reported and tried
  again on the next run.

Everything written is recorded as derived from its source (the item or the
document; a link from its two decisions), inside one ``derive.decisions``
activity per run that writes anything. Input that cannot make a decision (a
confidence that is not a number in [0, 1], an empty body, ...) is reported with
the reason, and nothing is written for that item.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID, insert
from sqlalchemy.orm import Session, aliased

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivation
from orchestrator.db.knowledge_models import Decision, DecisionLink, WorkingMemoryItem
from orchestrator.db.models import Document
from orchestrator.derive import poison
from orchestrator.derive.service import job_lock

ITEMS = "memory.working_memory"
DOCUMENTS = "sources.documents"
DEFAULT_CATEGORY = "general"
DEFAULT_CONFIDENCE = 1.0
MAX_TEXT = 20000
_BECAUSE = re.compile(r"\s+because\s+", re.IGNORECASE)
_CAUSES = (("caused_by", "caused"), ("influenced_by", "influenced"))


@dataclass
class DecisionsReport:
    recorded: int = 0
    updated: int = 0
    links: int = 0
    problems: list[str] = field(default_factory=list)
    decision_ids: list[uuid.UUID] = field(default_factory=list)


@dataclass(frozen=True)
class _New:
    source_table: str
    source_id: uuid.UUID
    where: str  # how the report names the item
    values: dict[str, Any]


@dataclass(frozen=True)
class _Known:
    id: uuid.UUID
    category: str
    decided_at: datetime
    scopes: frozenset[uuid.UUID]


class _Refused(ValueError):
    """Input that cannot make a decision; the message says why."""


def _text(name: str, value: object, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Refused(f"{name} is empty")
    return value.strip()[:limit]


def _category(value: object) -> str:
    if value is None or value == "":
        return DEFAULT_CATEGORY
    if not isinstance(value, str) or len(value.strip()) > 100 or not value.strip():
        raise _Refused(f"category {value!r} must be 1 to 100 characters")
    return value.strip()


def _confidence(value: object) -> float:
    if value is None or value == "":
        return DEFAULT_CONFIDENCE
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise _Refused(f"confidence {value!r} is not a number") from None
    if isinstance(value, bool) or not 0.0 <= number <= 1.0:
        raise _Refused(f"confidence {value!r} is outside [0, 1]")
    return number


def _moment(value: object) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        raise _Refused(f"decided_at {value!r} is not an ISO 8601 date or time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _paths(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    text = str(value).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [v.strip().strip("'\"") for v in text.split(",") if v.strip().strip("'\"")]


def from_item(text: str, user: str, session_id: str) -> tuple[str, str]:
    """(scenario, reasoning) of a decision item: a ``because`` splits them."""
    parts = _BECAUSE.split(text.strip(), maxsplit=1)
    if len(parts) == 2 and parts[0].strip() and parts[1].strip():
        return parts[0].strip()[:MAX_TEXT], ("Because " + parts[1].strip())[:MAX_TEXT]
    return text.strip()[:MAX_TEXT], f"Marked as a decision by {user} in session {session_id}."


def record(session: Session) -> DecisionsReport:
    """Record every marked item not yet recorded; link it; refresh decisions whose document changed."""
    job_lock(session, "decisions")
    writable_ids = func.auth.write_scopes(type_=ARRAY(UUID(as_uuid=True)))
    report = DecisionsReport()
    started = False

    def activity() -> None:
        nonlocal started
        if not started:
            begin_activity(session, "derive.decisions", {})
            started = True

    if poison.careful():
        # Item by item, an activity begun inside an item that is rolled back would be gone.
        activity()

    new: list[_New] = []
    w = WorkingMemoryItem
    recorded = aliased(Decision, name="recorded")
    for iid, user, sess, text_, category, scopes, created in session.execute(
            select(w.id, w.user_id, w.session_id, w.text, w.category, w.scopes, w.created_at)
            .outerjoin(recorded, and_(recorded.tenant_id == w.tenant_id, recorded.source_table == ITEMS,
                                      recorded.source_id == w.id))
            .where(w.kind == "decision", recorded.id.is_(None), w.scopes.contained_by(writable_ids))
            .order_by(w.created_at, w.id)):
        where = f"working-memory item {iid}"
        try:
            scenario, reasoning = from_item(_text("text", text_, MAX_TEXT), user, sess)
            values = {"category": _category(category), "scenario": scenario, "reasoning": reasoning,
                      "outcome": None, "confidence": DEFAULT_CONFIDENCE, "decided_at": created,
                      "decided_by": user, "scopes": list(scopes)}
        except _Refused as exc:
            report.problems.append(f"{where}: {exc}")
            continue
        new.append(_New(ITEMS, iid, where, values))

    d = Document
    docs = session.execute(
        select(d.id, d.collection, d.path, d.title, d.body, d.metadata_, d.scopes, d.author,
               d.occurred_at, d.created_at, recorded.id.label("decision_id"),
               recorded.outcome.label("decision_outcome"), recorded.confidence.label("decision_confidence"),
               recorded.scopes.label("decision_scopes"))
        .outerjoin(recorded, and_(recorded.tenant_id == d.tenant_id, recorded.source_table == DOCUMENTS,
                                  recorded.source_id == d.id))
        .where(func.lower(d.kind) == "decision", d.scopes.contained_by(writable_ids))
        .order_by(d.collection, d.path)).all()
    by_path: dict[tuple[str, str], uuid.UUID] = {}
    for doc in docs:
        by_path[(doc.collection, doc.path)] = doc.id
        where = f"document {doc.collection}/{doc.path}"
        meta = doc.metadata_ or {}
        try:
            outcome = meta.get("outcome") or None
            if outcome is not None:
                outcome = _text("outcome", outcome, MAX_TEXT)
            confidence = _confidence(meta.get("confidence"))
            if doc.decision_id is None:
                decided = _moment(meta.get("decided_at")) or doc.occurred_at or doc.created_at
                values = {"category": _category(meta.get("category")),
                          "scenario": _text("title", doc.title, MAX_TEXT),
                          "reasoning": _text("reasoning", meta.get("reasoning") or doc.body, MAX_TEXT),
                          "outcome": outcome, "confidence": confidence, "decided_at": decided,
                          "decided_by": doc.author, "scopes": list(doc.scopes)}
                new.append(_New(DOCUMENTS, doc.id, where, values))
                continue
        except _Refused as exc:
            report.problems.append(f"{where}: {exc}")
            continue
        stored = (doc.decision_outcome, float(doc.decision_confidence), sorted(doc.decision_scopes))
        if stored != (outcome, confidence, sorted(doc.scopes)):
            activity()
            with poison.item(session, f"the decision of {where}", restore=report):
                session.execute(update(Decision).where(Decision.id == doc.decision_id).values(
                    outcome=outcome, confidence=confidence, scopes=list(doc.scopes)))
                report.updated += 1
                record_derivation(session, ("memory.decisions", {"id": str(doc.decision_id)}),
                                  [(DOCUMENTS, {"id": str(doc.id)})])

    known = [_Known(i, c, at, frozenset(s)) for i, c, at, s in session.execute(
        select(Decision.id, Decision.category, Decision.decided_at, Decision.scopes))]
    for item in sorted(new, key=lambda n: (n.values["decided_at"], n.source_table, n.source_id)):
        activity()
        with poison.item(session, f"the decision of {item.where}", restore=report) as done:
            did = session.execute(insert(Decision).values(
                source_table=item.source_table, source_id=item.source_id, **item.values)
                .returning(Decision.id)).scalar_one()
            report.recorded += 1
            report.decision_ids.append(did)
            record_derivation(session, ("memory.decisions", {"id": str(did)}),
                              [(item.source_table, {"id": str(item.source_id)})])
            mine = _Known(did, item.values["category"], item.values["decided_at"],
                          frozenset(item.values["scopes"]))
            earlier = [k for k in known if k.category == mine.category and k.scopes & mine.scopes
                       and (k.decided_at, str(k.id)) < (mine.decided_at, str(mine.id))]
            if earlier:
                precedent = max(earlier, key=lambda k: (k.decided_at, str(k.id)))
                _link(session, report, precedent, mine, "precedent_for", item.where)
        if not done.skipped:
            known.append(mine)

    by_id = {k.id: k for k in known}
    decision_of: dict[uuid.UUID | None, uuid.UUID] = dict(session.execute(
        select(Decision.source_id, Decision.id).where(Decision.source_table == DOCUMENTS)).all())
    for doc in docs:
        meta = doc.metadata_ or {}
        target = by_id.get(decision_of.get(doc.id))  # type: ignore[arg-type]
        if target is None:
            continue
        for key, kind in _CAUSES:
            for ref in _paths(meta.get(key)):
                cause_doc = by_path.get((doc.collection, ref))
                if cause_doc is None and "/" in ref:
                    cause_doc = by_path.get(tuple(ref.split("/", 1)))  # type: ignore[arg-type]
                cause = by_id.get(decision_of.get(cause_doc)) if cause_doc else None  # type: ignore[arg-type]
                if cause is None:
                    report.problems.append(f"document {doc.collection}/{doc.path}: {key} {ref!r} is not a "
                                           "decision document you can write; the link waits for it")
                    continue
                if cause.id == target.id:
                    report.problems.append(f"document {doc.collection}/{doc.path}: {key} names itself")
                    continue
                with poison.item(session, f"the {kind} link of document {doc.collection}/{doc.path}",
                                 restore=report):
                    _link(session, report, cause, target, kind, f"document {doc.collection}/{doc.path}",
                          activity=activity)
    if started:
        end_activity(session)
    return report


def _link(session: Session, report: DecisionsReport, source: _Known, target: _Known, kind: str,
          where: str, activity: Any = None) -> None:
    shared = sorted(source.scopes & target.scopes)
    if not shared:
        report.problems.append(f"{where}: {kind} link from decision {source.id} not written: the two "
                               "decisions share no scope")
        return
    exists = session.execute(select(DecisionLink.id).where(
        DecisionLink.from_decision_id == source.id, DecisionLink.to_decision_id == target.id,
        DecisionLink.kind == kind)).first()
    if exists is not None:
        return
    if activity is not None:
        activity()
    lid = session.execute(insert(DecisionLink).values(
        from_decision_id=source.id, to_decision_id=target.id, kind=kind, scopes=shared)
        .on_conflict_do_nothing().returning(DecisionLink.id)).scalar()
    if lid is None:  # the link exists in a scope this identity cannot read
        return
    report.links += 1
    record_derivation(session, ("memory.decision_links", {"id": str(lid)}),
                      [("memory.decisions", {"id": str(source.id)}),
                       ("memory.decisions", {"id": str(target.id)})])
