"""Communities over the entity graph: a Louvain hierarchy with a summary per community and level.

The graph's edges are current world-fact relation claims (claims whose object
is an entity). It is built **per scope set**: claims shared into exactly the
same scopes form one graph, and its communities carry that scope set. Every
reader of such a community can read every claim its summary quotes (the read
rule depends only on the scope set), so a summary never mixes in evidence from
a scope its readers could not see. Only scope sets the bound identity may
write are rebuilt, since the community rows are written into them.

**Levels** are Louvain's passes (``orchestrator.derive.louvain``, deterministic, per
connected component so that an untouched component never changes): level 0 is the
first pass's partition (the finest), each level above merges communities of the level
below. An incremental run starts each level from the stored hierarchy (warm start), so
a few new claims move a few members instead of redrawing boundaries across the graph.
A community is stored at the lowest level
it appears at (a community a pass leaves unmerged is not stored again one level
up) and ``parent_id`` names the smallest community above that contains it; at
most ``derive_community_max_levels`` levels are kept. A level-0 summary is made
from the claims between its members; a higher one from its children's summaries
and the claims that connect them.

**Incremental** (``full=True`` deletes and rebuilds everything instead): each
level of a scope set is matched to its stored communities by member set.
``input_digest`` fingerprints what a summary is made from; a community whose
members, digest and summary method are unchanged is neither re-summarised nor
rewritten (a parent link that moved is updated alone). A changed one is
re-summarised and updated in place (best member overlap, so it keeps its id); a
vanished one is deleted; a new one is inserted. A changed child summary changes
its parent's digest, so changes climb to the top, and nothing else is touched.
An inserted or re-summarised community goes back on the embedding queue (the
requeue trigger resets the embedding when ``summary`` changes), which is how its
summary embedding stays current.

One run is one transaction under the job lock (``service.job_lock``), so two
concurrent runs (a worker tick and ``engram derive communities``) queue instead
of both inserting; it is one provenance activity, and every community written
anew records ``wasDerivedFrom`` edges to the claims it summarises (and, above
level 0, to its child communities), pinned to their current versions.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx  # type: ignore[import-untyped]
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivations
from orchestrator.config import Settings, get_settings
from orchestrator.db.knowledge_models import Community, current_claims
from orchestrator.derive import louvain, poison
from orchestrator.derive.digest import form_of, input_digest
from orchestrator.derive.quality import prose_or_all
from orchestrator.derive.service import job_lock
from orchestrator.derive.summarize import Summarizer, get_summarizer, split_sentences
from orchestrator.errors import BadInput

JOB = "communities"
MIN_MEMBERS = 2
EMPTY_SUMMARY = "A group of related entities."
TABLE = "memory.communities"
CLAIMS = "knowledge.fact_claim"
Members = frozenset[uuid.UUID]
ScopeKey = tuple[uuid.UUID, ...]
Progress = Callable[[int, int], None]
_UUIDS = ARRAY(UUID(as_uuid=True))


@dataclass
class LevelCounts:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    resummarised: int = 0  # summarizer calls
    relinked: int = 0  # rewritten only because the parent changed


@dataclass
class CommunityReport:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    resummarised: int = 0
    relinked: int = 0
    scope_sets: int = 0
    levels: dict[int, LevelCounts] = field(default_factory=dict)
    changed_ids: list[uuid.UUID] = field(default_factory=list)

    def count(self, level: int, what: str, n: int = 1) -> None:
        counts = self.levels.setdefault(level, LevelCounts())
        setattr(counts, what, getattr(counts, what) + n)
        setattr(self, what, getattr(self, what) + n)

    @property
    def height(self) -> int:
        return max(self.levels, default=-1) + 1


@dataclass(frozen=True)
class _Stored:
    id: uuid.UUID
    level: int
    members: Members
    parent_id: uuid.UUID | None
    summary: str
    method: str
    model: str | None
    digest: bytes | None


@dataclass(eq=False)
class _Node:
    level: int
    members: Members
    parent: _Node | None = None
    children: list[_Node] = field(default_factory=list)
    claims: list[tuple[uuid.UUID, str]] = field(default_factory=list)  # what this level adds
    stored: _Stored | None = None
    id: uuid.UUID | None = None
    summary: str = ""
    method: str = ""
    model: str | None = None
    digest: bytes = b""
    anew: bool = False  # members, digest or summary differ from the stored row: edges recorded


def hierarchy(graph: nx.Graph, max_levels: int,
              previous: Mapping[uuid.UUID, Sequence[uuid.UUID | None]] | None = None) -> list[list[Members]]:
    """Louvain's levels, finest first; each community at the lowest level it appears at.

    Each connected component is clustered on its own, its nodes and edges in sorted order,
    so a component no changed claim touches comes out exactly as it did last time: only
    the components that changed can change communities (a community never spans two
    components, which Louvain over the whole graph would not do either). ``previous[e][k]``
    is entity e's stored community at level k (see ``_previous``): each level starts from
    it (``louvain.hierarchy``), so a small change moves few members.
    """
    levels: list[list[Members]] = [[] for _ in range(max_levels)]
    for component in sorted((sorted(c) for c in nx.connected_components(graph)), key=lambda c: c[0]):
        index = {entity: i for i, entity in enumerate(component)}
        sub = louvain.WeightedGraph(len(component))
        for u, v, w in sorted((*sorted((u, v)), w) for u, v, w in graph.edges(component, data="weight")):
            sub.add_edge(index[u], index[v], float(w))
        earlier: list[list[uuid.UUID | None]] = []
        if previous:
            nothing: list[uuid.UUID | None] = [None] * max_levels
            earlier = [[previous.get(e, nothing)[k] for e in component] for k in range(max_levels)]
        seen: set[Members] = set()
        for level, labels in enumerate(louvain.hierarchy(sub, max_levels, earlier)):
            groups: dict[int, list[uuid.UUID]] = defaultdict(list)
            for i, label in enumerate(labels):
                groups[label].append(component[i])
            new = [c for c in map(frozenset, groups.values()) if len(c) >= MIN_MEMBERS and c not in seen]
            seen.update(new)
            levels[level] += new
    return [sorted(found, key=sorted) for found in levels if found]


def _previous(stored: list[_Stored], max_levels: int) -> dict[uuid.UUID, list[uuid.UUID | None]]:
    """Each entity's stored community per level: the one of the highest level <= k holding it.

    A community is stored at the lowest level it appears at, so at a level where it was not
    merged it is still the entity's community; below its lowest community an entity was alone.
    """
    holding: dict[uuid.UUID, list[_Stored]] = defaultdict(list)
    for row in stored:
        for member in row.members:
            holding[member].append(row)
    out: dict[uuid.UUID, list[uuid.UUID | None]] = {}
    for entity, rows in holding.items():
        rows.sort(key=lambda r: r.level)
        labels: list[uuid.UUID | None] = []
        below = -1
        for k in range(max_levels):
            while below + 1 < len(rows) and rows[below + 1].level <= k:
                below += 1
            labels.append(rows[below].id if below >= 0 else None)
        out[entity] = labels
    return out


def _plan(graph: nx.Graph, evidence: list[tuple[uuid.UUID, uuid.UUID, uuid.UUID, str]],
          max_levels: int, previous: list[_Stored]) -> list[_Node]:
    """The communities of one scope set's graph, linked to their parents, with each level's claims."""
    nodes: list[_Node] = []
    # Levels nest, so the community above that holds any one member holds them all.
    holding: list[dict[uuid.UUID, _Node]] = []
    for level, communities in enumerate(hierarchy(graph, max_levels, _previous(previous, max_levels))):
        here = [_Node(level, members) for members in communities]
        holding.append({m: n for n in here for m in n.members})
        nodes += here
    for node in nodes:
        some = next(iter(node.members))
        node.parent = next((up[some] for up in holding[node.level + 1:] if some in up), None)
        if node.parent is not None:
            node.parent.children.append(node)
    # A claim belongs to the lowest community holding both its ends: a child's claims
    # reach its parent through the child's summary, not again.
    holder: dict[uuid.UUID, list[_Node]] = defaultdict(list)
    for node in nodes:
        for member in node.members:
            holder[member].append(node)
    for claim_id, subject, obj, text_ in evidence:
        both = [n for n in holder.get(subject, []) if obj in n.members]
        if both:
            min(both, key=lambda n: n.level).claims.append((claim_id, text_))
    for node in nodes:
        node.children.sort(key=lambda n: sorted(n.members))
        node.claims.sort()
    return nodes


def _match(nodes: list[_Node], stored: list[_Stored]) -> list[_Stored]:
    """Give planned nodes the stored row of their level they continue; returns the rows left over."""
    left: dict[int, dict[uuid.UUID, _Stored]] = defaultdict(dict)
    exact: dict[tuple[int, Members], _Stored] = {}
    for row in stored:
        left[row.level][row.id] = row
        exact.setdefault((row.level, row.members), row)
    unmatched = []
    for node in nodes:
        same = exact.get((node.level, node.members))
        if same is None or same.id not in left[node.level]:
            unmatched.append(node)
            continue
        del left[node.level][same.id]
        node.stored, node.id = same, same.id
    # The rest continue the stored row of their level they overlap most (only rows that share
    # a member can overlap at all).
    sharing: dict[tuple[int, uuid.UUID], list[_Stored]] = defaultdict(list)
    for level, rows in left.items():
        for row in rows.values():
            for member in row.members:
                sharing[(level, member)].append(row)
    for node in unmatched:
        pool = left[node.level]
        candidates = {r.id: r for m in node.members for r in sharing.get((node.level, m), []) if r.id in pool}
        best = max(candidates.values(), key=lambda r: (_jaccard(r.members, node.members), str(r.id)),
                   default=None)
        if best is not None:
            del pool[best.id]
            node.stored, node.id = best, best.id
    return [r for rows in left.values() for r in rows.values()]


def _jaccard(a: Members, b: Members) -> float:
    return len(a & b) / len(a | b)


def _summarise(nodes: list[_Node], summarizer: Summarizer, report: CommunityReport,
               done: list[int], total: int, progress: Progress | None,
               prose_only: bool = True) -> None:
    """Bottom-up: a node whose input digest and summary method match its stored row keeps its
    summary. ``prose_only`` (``derive_quality_gates``): a node is summarised from its claims'
    prose sentences (``quality.prose_or_all``: all of them when none is), as RAPTOR's
    leaves are: a property list's line ("socketPath `string | null` (optional) - Default:
    `null` - ...") was a community's summary."""
    wanted = (summarizer.method, summarizer.model)
    for node in sorted(nodes, key=lambda n: n.level):
        child_summaries = [k.summary for k in node.children]
        # "prose": the rule that picks the sentences, so a community summarised before it is
        # summarised again once.
        made_of = ("community", node.level, node.claims, child_summaries,
                   *(("prose",) if prose_only else ()))
        node.digest = input_digest(*made_of, *form_of(summarizer.method))
        s = node.stored
        if s is not None and s.digest == node.digest and (s.method, s.model) == wanted:
            node.summary, node.method, node.model = s.summary, s.method, s.model
        else:
            said = [t for _, t in node.claims]
            sentences = prose_or_all(said) if prose_only else said
            sentences += [x for summary in child_summaries for x in split_sentences(summary)]
            made = summarizer.summarize(sentences)
            node.summary, node.method, node.model = made.text or EMPTY_SUMMARY, made.method, made.model
            # The digest of what made it (an endpoint that failed falls back to extractive).
            node.digest = input_digest(*made_of, *form_of(made.method))
            report.count(node.level, "resummarised")
        node.anew = s is None or (s.members, s.digest, s.summary, s.method, s.model) != (
            node.members, node.digest, node.summary, node.method, node.model)
        done[0] += 1
        if progress is not None:
            progress(done[0], total)


def _write(session: Session, key: ScopeKey, nodes: list[_Node], gone: list[_Stored],
           report: CommunityReport) -> list[_Node]:
    """Top-down, so each row is written with its final parent; then vanished rows go.

    Returns the nodes written anew (inserted, or members, digest or summary changed).
    """
    made: list[_Node] = []
    for node in sorted(nodes, key=lambda n: -n.level):
        parent_id = node.parent.id if node.parent is not None else None
        s = node.stored
        values = {"member_entity_ids": sorted(node.members), "summary": node.summary,
                  "summary_method": node.method, "summary_model": node.model, "input_digest": node.digest,
                  "parent_id": parent_id}
        if s is None:
            node.id = session.execute(insert(Community).values(level=node.level, scopes=list(key), **values)
                                      .returning(Community.id)).scalar_one()
            report.count(node.level, "inserted")
        elif node.anew:
            session.execute(update(Community).where(Community.id == s.id)
                            .values(built_at=func.now(), **values))
            report.count(node.level, "updated")
        elif s.parent_id != parent_id:
            session.execute(update(Community).where(Community.id == s.id).values(parent_id=parent_id))
            report.count(node.level, "relinked")
            continue
        else:
            report.count(node.level, "unchanged")
            continue
        assert node.id is not None
        report.changed_ids.append(node.id)
        made.append(node)
    if gone:
        session.execute(delete(Community).where(Community.id.in_([r.id for r in gone])))
        for row in gone:
            report.count(row.level, "deleted")
    return made


def _edges(made: list[_Node]) -> list[tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]]:
    edges = []
    for node in made:
        derived = (TABLE, {"id": str(node.id)})
        edges += [(derived, (CLAIMS, {"id": str(c)})) for c, _ in node.claims]
        edges += [(derived, (TABLE, {"id": str(k.id)})) for k in node.children]
    return edges


def _max_levels(settings: Settings) -> int:
    value = settings.derive_community_max_levels
    if not 1 <= value <= 32:
        raise BadInput("derive_community_max_levels (ENGRAM_DERIVE_COMMUNITY_MAX_LEVELS) must be between "
                       f"1 and 32, got {value}")
    return value


def rebuild(session: Session, *, full: bool = False, settings: Settings | None = None,
            on_progress: Progress | None = None) -> CommunityReport:
    """Recompute every writable scope set's community hierarchy; touch only what changed.

    ``full`` deletes the stored communities and builds them again from scratch (new
    ids, every summary made again). ``on_progress(done, total)`` is called after each
    community is planned (for a progress bar).
    """
    settings = settings or get_settings()
    max_levels = _max_levels(settings)
    summarizer = get_summarizer(settings)
    job_lock(session, JOB)
    writable = current_claims.c.scopes.contained_by(func.auth.write_scopes(type_=_UUIDS))
    rows = session.execute(
        select(current_claims.c.id, current_claims.c.subject_id, current_claims.c.object_id,
               current_claims.c.scopes, current_claims.c.text)
        .where(current_claims.c.object_id.is_not(None), current_claims.c.epistemic_kind == "world_fact",
               current_claims.c.subject_id != current_claims.c.object_id, writable)
        .order_by(current_claims.c.id)
    ).all()
    graphs: dict[ScopeKey, nx.Graph] = defaultdict(nx.Graph)
    evidence: dict[ScopeKey, list[tuple[uuid.UUID, uuid.UUID, uuid.UUID, str]]] = defaultdict(list)
    for claim_id, subject, obj, scopes, text_ in rows:
        key = tuple(sorted(scopes))
        g = graphs[key]
        weight = g.get_edge_data(subject, obj, {"weight": 0})["weight"] + 1
        g.add_edge(subject, obj, weight=weight)
        evidence[key].append((claim_id, subject, obj, text_))
    stored_rows = session.execute(
        select(Community.id, Community.level, Community.scopes, Community.member_entity_ids,
               Community.parent_id, Community.summary, Community.summary_method, Community.summary_model,
               Community.input_digest)
        .where(Community.scopes.contained_by(func.auth.write_scopes(type_=_UUIDS)))
    ).all()
    stored: dict[ScopeKey, list[_Stored]] = defaultdict(list)
    for r in stored_rows:
        stored[tuple(sorted(r.scopes))].append(_Stored(
            r.id, r.level, frozenset(r.member_entity_ids), r.parent_id, r.summary, r.summary_method,
            r.summary_model,
            None if r.input_digest is None else bytes(r.input_digest)))

    report = CommunityReport()
    plans: list[tuple[ScopeKey, list[_Node], list[_Stored]]] = []
    for key in sorted(set(graphs) | set(stored)):
        report.scope_sets += 1
        g = graphs.get(key)
        earlier = stored.get(key, [])
        nodes = _plan(g, evidence[key], max_levels, [] if full else earlier) if g is not None else []
        plans.append((key, nodes, list(earlier) if full else _match(nodes, earlier)))
    total = sum(len(nodes) for _, nodes, _ in plans)
    done = [0]
    started = False
    for key, nodes, gone in plans:
        _summarise(nodes, summarizer, report, done, total, on_progress,
                   settings.derive_quality_gates)
        if not gone and not any(n.anew or n.stored is None or n.stored.parent_id != (
                n.parent.id if n.parent is not None else None) for n in nodes):
            for n in nodes:
                report.count(n.level, "unchanged")
            continue
        if not started:
            begin_activity(session, "derive.communities", {
                "method": summarizer.method, "model": summarizer.model, "algorithm": "louvain-warm-start",
                "max_levels": max_levels, "full": full})
            started = True
        with poison.item(session, f"the communities of scope set {', '.join(map(str, key))}",
                         restore=report):
            made = _write(session, key, nodes, gone, report)
            # Last, so each edge pins the final version of a child (its parent link included).
            record_derivations(session, _edges(made))
    if started:
        end_activity(session)
    return report
