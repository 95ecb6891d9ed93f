"""Consolidation: observations synthesised from repeated or corroborating claims.

Claims corroborate each other when they say the same thing in the same place:
the same **scope set**, **perspective partition** (``world`` for world facts,
``user:<author>`` for a person's opinions, preferences and experiences),
subject, predicate and object (entity, or typed literal). Only current claims
that no keyed fact beats are read, and only in scope sets the bound identity
may write (the observation is shared into exactly that set, so every reader of
it can read every claim it stands on, and it never mixes partitions).

Evidence is counted per **independent source**:

* an extracted claim (``author_role = 'extractor'``) stands for the **document**
  it was read from (``memory.extractions``): every sentence and chunk of one
  document is one witness, however often it repeats itself, and the extractor's
  one author never corroborates itself;
* another world fact stands for its **author**: one person or agent asserting
  the same statement twice, in any words, is one witness;
* in a person's own partition (opinions, preferences, experiences, always one
  author) a source is an ``(author, content)`` pair: saying the same thing again
  in other words on another occasion is repetition, which is what those
  observations are made of.

The bookkeeping predicates of extraction (``mentioned_in``, ``co_mentioned_with``)
become observations only when at least ``min_evidence`` distinct **documents**
say them; nothing else counts for them. A group with at least ``min_evidence``
(2) sources becomes an observation with

    confidence = 1 - Π (1 - c_s)     (noisy-or over sources)

where ``c_s`` is the highest confidence among a source's claims: each source is
treated as an independent chance that the statement is true. The same
extracted statement in three documents at 0.3 gives 0.657; two user assertions
at 0.9 give 0.99. Every
observation is written with its true confidence; only those at or above 0.65
are recallable (``memory.recallable_observations``).

**Quality gates** (``orchestrator.derive.quality``): a claim whose sentence is
not prose (code, a URL, markup, numbers, a log line) is not evidence for an
observation; and groups that would write the same observation (the same
sentences in the same scope set and partition, e.g. one sentence that
co-mentions several entities) are **one** observation: the group with the most
sources (then a statement before a co-mention, then the smallest key) is written,
the others are not.

``observation_key`` (a hash of the group) is the observation's identity: a
rerun updates an observation in place when its sources or confidence changed,
leaves it alone when they did not, and deletes it when its group no longer has
enough sources. Each written observation is recorded as derived from its claims,
inside one ``derive.consolidate`` activity per run that writes anything.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivation
from orchestrator.config import Settings
from orchestrator.db.knowledge_models import RECALLABLE_CONFIDENCE, Observation, effective_claims
from orchestrator.derive import poison
from orchestrator.derive.digest import Digester
from orchestrator.derive.extract import AUTHOR_ROLE, BOOKKEEPING_PREDICATES
from orchestrator.derive.quality import plausible_statement
from orchestrator.derive.service import job_lock
from orchestrator.errors import BadInput

MIN_EVIDENCE = 2
MAX_SENTENCES = 2
KEY_PREFIX = "obs:"

_GroupKey = tuple[tuple[uuid.UUID, ...], str, uuid.UUID, str, uuid.UUID | None, str | None, str]


@dataclass
class ConsolidateReport:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    recallable: int = 0
    changed_ids: list[uuid.UUID] = field(default_factory=list)


@dataclass(frozen=True)
class _Evidence:
    claim: uuid.UUID
    author: str
    author_role: str
    content: uuid.UUID
    partition: str
    predicate: str
    confidence: float


@dataclass
class _Group:
    claims: list[tuple[uuid.UUID, str]] = field(default_factory=list)  # (claim, text)
    evidence: list[_Evidence] = field(default_factory=list)
    sources: dict[tuple[str, str], float] = field(default_factory=dict)  # source -> its best confidence

    def count_sources(self, documents: dict[uuid.UUID, uuid.UUID]) -> None:
        """Independent sources (see the module docstring), each at its best claim's confidence."""
        self.sources = {}
        for e in self.evidence:
            source = _source(e, documents)
            if source is not None:
                self.sources[source] = max(self.sources.get(source, 0.0), e.confidence)

    def corroborated(self, min_evidence: int) -> bool:
        return len(self.sources) >= min_evidence

    @property
    def confidence(self) -> float:
        return round(noisy_or(list(self.sources.values())), 9)


def _source(e: _Evidence, documents: dict[uuid.UUID, uuid.UUID]) -> tuple[str, str] | None:
    if e.author_role == AUTHOR_ROLE and e.claim in documents:
        return ("document", str(documents[e.claim]))
    if e.predicate in BOOKKEEPING_PREDICATES:
        return None  # where an entity is named counts only across documents
    if e.author_role == AUTHOR_ROLE:
        # Read from a chunk whose record is gone: its text alone is what we know of it.
        return ("text", str(e.content))
    if e.partition == "world":
        return ("author", e.author)
    return ("author+text", f"{e.author}\n{e.content}")


def _extracted_documents(session: Session, claim_ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
    """claim -> the document it was extracted from, for the extracted claims asked about."""
    if not claim_ids:
        return {}
    rows = session.execute(text(
        "select x.id, ch.document_id from memory.extractions e "
        "join sources.chunks ch on ch.tenant_id = e.tenant_id and ch.id = e.chunk_id "
        "cross join lateral unnest(e.claim_ids) as x(id) "
        "where x.id = any(cast(:ids as uuid[]))"), {"ids": claim_ids}).all()
    return {r[0]: r[1] for r in rows}


def observation_key(key: _GroupKey) -> str:
    """The stable identity of a group: its scope set, partition, subject, predicate and object."""
    scopes, partition, subject, predicate, object_id, value, datatype = key
    body = json.dumps([[str(s) for s in scopes], partition, str(subject), predicate,
                       None if object_id is None else str(object_id), value, datatype])
    return KEY_PREFIX + hashlib.sha256(body.encode()).hexdigest()


def noisy_or(confidences: list[float]) -> float:
    return 1.0 - math.prod(1.0 - c for c in confidences)


def consolidate(session: Session, *, min_evidence: int = MIN_EVIDENCE,
                settings: Settings | None = None) -> ConsolidateReport:
    """Write, update or delete observations so they match the corroborated claims now."""
    if isinstance(min_evidence, bool) or not isinstance(min_evidence, int) or min_evidence < 2:
        raise BadInput(f"min_evidence must be an integer of at least 2 (one claim corroborates "
                       f"nothing), not {min_evidence!r}")
    job_lock(session, "consolidate")
    uuids = ARRAY(UUID(as_uuid=True))
    c = effective_claims.c
    rows = session.execute(
        select(c.id, c.scopes, c.perspective_key, c.subject_id, c.predicate, c.object_id,
               c.object_value, c.object_datatype, c.author, c.author_role, c.content_id, c.confidence,
               c.text)
        .where(c.beaten_by.is_(None), c.scopes.contained_by(func.auth.write_scopes(type_=uuids)))
        .order_by(c.id)
    ).all()
    groups: dict[_GroupKey, _Group] = defaultdict(_Group)
    extracted: set[uuid.UUID] = set()
    gates = settings.derive_quality_gates if settings is not None else True
    for r in rows:
        if gates and not plausible_statement(r.text):
            continue
        key: _GroupKey = (tuple(sorted(r.scopes)), r.perspective_key, r.subject_id, r.predicate,
                          r.object_id, r.object_value, r.object_datatype)
        g = groups[key]
        g.claims.append((r.id, r.text))
        g.evidence.append(_Evidence(r.id, r.author, r.author_role, r.content_id, r.perspective_key,
                                    r.predicate, float(r.confidence)))
        if r.author_role == AUTHOR_ROLE:
            extracted.add(r.id)
    documents = _extracted_documents(session, [cid for g in groups.values() if len(g.claims) >= min_evidence
                                                for cid, _ in g.claims if cid in extracted])
    for g in groups.values():
        g.count_sources(documents)
    wanted = {observation_key(k): (k, g) for k, g in groups.items() if g.corroborated(min_evidence)}
    if gates:
        wanted = _one_per_text(wanted)

    stored = {key: (oid, round(float(conf), 9), frozenset(claims))
              for oid, key, conf, claims in session.execute(
                  select(Observation.id, Observation.observation_key, Observation.confidence,
                         Observation.source_claim_ids)
                  .where(Observation.observation_key.startswith(KEY_PREFIX),
                         Observation.scopes.contained_by(func.auth.write_scopes(type_=uuids))))
              if key is not None}

    report = ConsolidateReport()
    digest = Digester(settings)
    started = False
    for okey in sorted(set(wanted) | set(stored)):
        if not started and (okey not in wanted or okey not in stored
                            or _differs(stored[okey], wanted[okey][1])):
            begin_activity(session, "derive.consolidate", {"min_evidence": min_evidence})
            started = True
        with poison.item(session, f"observation {okey}", restore=report):
            _write(session, report, okey, wanted.get(okey), stored.get(okey), digest)
    if started:
        end_activity(session)
    return report


def _one_per_text(wanted: dict[str, tuple[_GroupKey, _Group]]) -> dict[str, tuple[_GroupKey, _Group]]:
    """Groups that would say the same thing (same scopes, partition and sentences) as one:
    the best-sourced group keeps it (then a statement before a bookkeeping co-mention, then
    the smallest key); the others are not written (the same sentences are its evidence).
    Nor is a group whose sentences another kept group of its scopes and partition says
    with more (one sentence served twice, alone and inside a longer observation, when two
    subjects' groups shared it)."""
    by_text: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    for okey, (gkey, group) in wanted.items():
        texts = frozenset(" ".join(t.split()).lower() for _, t in group.claims)
        by_text[(gkey[0], gkey[1], texts)].append(okey)
    kept = {key: min(okeys, key=lambda k: (-len(wanted[k][1].sources),
                                           wanted[k][0][3] in BOOKKEEPING_PREDICATES, k))
            for key, okeys in by_text.items()}
    holding: dict[tuple[Any, Any, str], list[frozenset[str]]] = defaultdict(list)
    for scopes, partition, texts in kept:
        for t in texts:
            holding[(scopes, partition, t)].append(texts)
    keep = {okey for (scopes, partition, texts), okey in kept.items()
            if not any(texts < other for other in min(
                (holding[(scopes, partition, t)] for t in texts), key=len))}
    return {k: v for k, v in wanted.items() if k in keep}


def _write(session: Session, report: ConsolidateReport, okey: str,
           wanted: tuple[_GroupKey, _Group] | None,
           old: tuple[uuid.UUID, float, frozenset[uuid.UUID]] | None, digest: Digester) -> None:
    """Bring one observation in line with its group: delete, leave, update or insert it."""
    if wanted is None:
        assert old is not None
        session.execute(delete(Observation).where(Observation.id == old[0]))
        report.deleted += 1
        return
    gkey, group = wanted
    if group.confidence >= RECALLABLE_CONFIDENCE:
        report.recallable += 1
    if old is not None and not _differs(old, group):
        report.unchanged += 1
        return
    claim_ids = sorted(cid for cid, _ in group.claims)
    made = digest([t for _, t in group.claims], max_sentences=MAX_SENTENCES)
    values = {"text": made.text or group.claims[0][1], "confidence": group.confidence,
              "source_claim_ids": claim_ids, "summary_method": made.method,
              "summary_model": made.model}
    if old is not None:
        oid = old[0]
        session.execute(update(Observation).where(Observation.id == oid).values(**values))
        report.updated += 1
    else:
        scopes, partition, subject = gkey[0], gkey[1], gkey[2]
        oid = session.execute(insert(Observation).values(
            observation_key=okey, subject_entity_id=subject, perspective_key=partition,
            scopes=list(scopes), **values).returning(Observation.id)).scalar_one()
        report.inserted += 1
    report.changed_ids.append(oid)
    record_derivation(session, ("memory.observations", {"id": str(oid)}),
                      [("knowledge.fact_claim", {"id": str(cid)}) for cid in claim_ids])


def _differs(old: tuple[uuid.UUID, float, frozenset[uuid.UUID]], group: _Group) -> bool:
    return old[1] != group.confidence or old[2] != frozenset(cid for cid, _ in group.claims)
