"""Communities over the entity graph: Louvain clusters with an extractive summary each.

The graph's edges are current world-fact relation claims (claims whose object
is an entity). It is built **per scope set**: claims shared into exactly the
same scopes form one graph, and its communities carry that scope set. Every
reader of such a community can read every claim its summary quotes (the read
rule depends only on the scope set), so a summary never mixes in evidence from
a scope its readers could not see. Only scope sets the bound identity may
write are rebuilt, since the community rows are written into them.

Incremental: a new partition is matched to the stored communities of the same
scope set by member overlap. A community whose member set is unchanged is left
alone (not re-summarised, not rewritten); a changed one is updated in place; a
vanished one is deleted; a new one is inserted. Louvain is seeded, so an
unchanged graph always gives the same partition. Summaries come from the
configured summarizer (``summarize.get_summarizer``) and record its method and
model; an unchanged community whose summary another method or model made is
re-summarised (and rewritten only if the summary then differs).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import networkx as nx  # type: ignore[import-untyped]
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivation
from orchestrator.config import Settings
from orchestrator.db.knowledge_models import Community, current_claims
from orchestrator.derive.summarize import get_summarizer

LEVEL = 0
SEED = 42
MIN_MEMBERS = 2
_Evidence = list[tuple[uuid.UUID, uuid.UUID, uuid.UUID, str]]  # claim, subject, object, text


@dataclass
class CommunityReport:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    scope_sets: int = 0
    changed_ids: list[uuid.UUID] = field(default_factory=list)


def _jaccard(a: frozenset[uuid.UUID], b: frozenset[uuid.UUID]) -> float:
    return len(a & b) / len(a | b)


def rebuild(session: Session, *, settings: Settings | None = None) -> CommunityReport:
    """Recompute level-0 communities for every writable scope set; touch only what changed."""
    summarizer = get_summarizer(settings)
    writable = current_claims.c.scopes.contained_by(func.auth.write_scopes(type_=ARRAY(UUID(as_uuid=True))))
    rows = session.execute(
        select(current_claims.c.id, current_claims.c.subject_id, current_claims.c.object_id,
               current_claims.c.scopes, current_claims.c.text)
        .where(current_claims.c.object_id.is_not(None), current_claims.c.epistemic_kind == "world_fact",
               current_claims.c.subject_id != current_claims.c.object_id, writable)
        .order_by(current_claims.c.id)
    ).all()
    graphs: dict[tuple[uuid.UUID, ...], nx.Graph] = defaultdict(nx.Graph)
    evidence: dict[tuple[uuid.UUID, ...], _Evidence] = defaultdict(list)
    for claim_id, subject, obj, scopes, text_ in rows:
        key = tuple(sorted(scopes))
        g = graphs[key]
        weight = g.get_edge_data(subject, obj, {"weight": 0})["weight"] + 1
        g.add_edge(subject, obj, weight=weight)
        evidence[key].append((claim_id, subject, obj, text_))
    stored = session.execute(
        select(Community.id, Community.scopes, Community.member_entity_ids, Community.summary,
               Community.summary_method, Community.summary_model)
        .where(Community.level == LEVEL,
               Community.scopes.contained_by(func.auth.write_scopes(type_=ARRAY(UUID(as_uuid=True)))))
    ).all()
    existing: dict[tuple[uuid.UUID, ...], dict[uuid.UUID, frozenset[uuid.UUID]]] = defaultdict(dict)
    made: dict[uuid.UUID, tuple[str, str, str | None]] = {}
    for cid, scopes, stored_members, summary_text, method, model in stored:
        existing[tuple(sorted(scopes))][cid] = frozenset(stored_members)
        made[cid] = (summary_text, method, model)

    report = CommunityReport()
    started = False
    for key in sorted(set(graphs) | set(existing)):
        report.scope_sets += 1
        g = graphs.get(key)
        parts: list[frozenset[uuid.UUID]] = [
            frozenset(c) for c in nx.community.louvain_communities(g, weight="weight", seed=SEED)
        ] if g is not None else []
        found = sorted((c for c in parts if len(c) >= MIN_MEMBERS), key=lambda c: sorted(c))
        old = dict(existing.get(key, {}))
        unmatched: list[frozenset[uuid.UUID]] = []
        restyled: list[tuple[uuid.UUID, frozenset[uuid.UUID]]] = []
        for members in found:
            same = next((cid for cid, m in old.items() if m == members), None)
            if same is None:
                unmatched.append(members)
                continue
            del old[same]
            if made[same][1:] == (summarizer.method, summarizer.model):
                report.unchanged += 1
            else:
                restyled.append((same, members))
        todo: list[tuple[uuid.UUID | None, frozenset[uuid.UUID]]] = [
            *restyled, *((None, m) for m in unmatched)]
        for target, members in todo:
            facts = [(c, t) for c, s, o, t in evidence[key] if s in members and o in members]
            made_now = summarizer.summarize([t for _, t in facts])
            summary = made_now.text or "A group of related entities."
            if target is not None and made[target] == (summary, made_now.method, made_now.model):
                report.unchanged += 1  # re-summarised by the configured method, same result
                continue
            if not started:
                begin_activity(session, "derive.communities",
                               {"method": summarizer.method, "model": summarizer.model, "seed": SEED})
                started = True
            if target is None:
                best = max(old, key=lambda cid: (_jaccard(old[cid], members), str(cid)), default=None)
                if best is not None and _jaccard(old[best], members) > 0:
                    target = best
                    del old[best]
            ordered = sorted(members)
            written = {"summary": summary, "summary_method": made_now.method,
                       "summary_model": made_now.model}
            if target is not None:
                session.execute(update(Community).where(Community.id == target).values(
                    member_entity_ids=ordered, built_at=func.now(), **written))
                cid = target
                report.updated += 1
            else:
                cid = session.execute(insert(Community).values(
                    level=LEVEL, member_entity_ids=ordered, scopes=list(key), **written
                ).returning(Community.id)).scalar_one()
                report.inserted += 1
            report.changed_ids.append(cid)
            record_derivation(session, ("memory.communities", {"id": str(cid)}),
                              [("knowledge.fact_claim", {"id": str(c)}) for c, _ in facts])
        if old:
            session.execute(delete(Community).where(Community.id.in_(list(old))))
            report.deleted += len(old)
    if started:
        end_activity(session)
    return report
