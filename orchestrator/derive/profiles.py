"""Profiles of person entities: an extractive summary of their current world facts.

One profile per ``(person, scope set)``: the claims about a person shared into
exactly the same scopes are summarised together and the profile carries that
scope set, so a reader of a profile can read every claim it draws on. Only
world facts are used: opinions, preferences and experiences live in their
creator's perspective partition and must not reach the readers of a shared
profile. A profile is rewritten only when its summary (text, method or model)
changes; the derived-memory requeue trigger then puts it back on the embedding
queue, which is how a changed profile is re-embedded. Summaries come from the
configured summarizer (``summarize.get_summarizer``); an abstractive endpoint is
asked at temperature 0, so an unchanged profile normally reads the same.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivation
from orchestrator.config import Settings
from orchestrator.db.knowledge_models import Entity, Profile, current_claims
from orchestrator.derive.summarize import get_summarizer

PERSON = "person"


@dataclass
class ProfileReport:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0


def refresh(session: Session, *, entity_type: str = PERSON, max_sentences: int = 5,
            settings: Settings | None = None) -> ProfileReport:
    """Build or refresh the profiles of every visible entity of ``entity_type``, per scope set."""
    summarizer = get_summarizer(settings)
    uuids = ARRAY(UUID(as_uuid=True))
    c = current_claims.c
    rows = session.execute(
        select(c.id, c.subject_id, c.scopes, c.text, Entity.canonical_name)
        .join(Entity, (Entity.tenant_id == c.tenant_id) & (Entity.id == c.subject_id))
        .where(Entity.entity_type == entity_type, Entity.merged_into.is_(None),
               c.epistemic_kind == "world_fact",
               c.scopes.contained_by(func.auth.write_scopes(type_=uuids)))
        .order_by(c.id)
    ).all()
    wanted: dict[tuple[uuid.UUID, tuple[uuid.UUID, ...]], list[tuple[uuid.UUID, str]]] = defaultdict(list)
    names: dict[uuid.UUID, str] = {}
    for claim_id, subject, scopes, text_, name in rows:
        wanted[(subject, tuple(sorted(scopes)))].append((claim_id, text_))
        names[subject] = name
    stored = session.execute(
        select(Profile.id, Profile.subject_entity_id, Profile.scopes, Profile.summary,
               Profile.summary_method, Profile.summary_model)
        .join(Entity, (Entity.tenant_id == Profile.tenant_id) & (Entity.id == Profile.subject_entity_id))
        .where(Entity.entity_type == entity_type,
               Profile.scopes.contained_by(func.auth.write_scopes(type_=uuids)))
    ).all()
    existing: dict[tuple[uuid.UUID, tuple[uuid.UUID, ...]], tuple[uuid.UUID, str, str, str | None]] = {
        (subject, tuple(sorted(scopes))): (pid, summary, method, model)
        for pid, subject, scopes, summary, method, model in stored if subject is not None}
    report = ProfileReport()
    started = False
    for key in sorted(set(wanted) | set(existing)):
        facts = wanted.get(key)
        if not facts:
            session.execute(delete(Profile).where(Profile.id == existing[key][0]))
            report.deleted += 1
            continue
        made = summarizer.summarize([t for _, t in facts], max_sentences=max_sentences)
        summary = f"{names[key[0]]}: " + made.text
        old = existing.get(key)
        if old is not None and old[1:] == (summary, made.method, made.model):
            report.unchanged += 1
            continue
        if not started:
            begin_activity(session, "derive.profiles", {
                "method": summarizer.method, "model": summarizer.model, "entity_type": entity_type})
            started = True
        written = {"summary": summary, "summary_method": made.method, "summary_model": made.model}
        if old is not None:
            session.execute(update(Profile).where(Profile.id == old[0]).values(**written))
            pid = old[0]
            report.updated += 1
        else:
            pid = session.execute(insert(Profile).values(
                subject_entity_id=key[0], scopes=list(key[1]), **written).returning(Profile.id)
            ).scalar_one()
            report.inserted += 1
        record_derivation(session, ("memory.profiles", {"id": str(pid)}),
                          [("knowledge.fact_claim", {"id": str(cid)}) for cid, _ in facts])
    if started:
        end_activity(session)
    return report
