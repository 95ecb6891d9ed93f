"""RAPTOR: recursive cluster summaries of chunks and facts, up to a root per scope set.

Recursive Abstractive Processing for Tree-Organized Retrieval. The leaves of the
tree (level 0) cluster **items**: embedded chunks of current (not archived)
documents, and the fact contents of current world-fact claims (extracted claims
are left out: their text is a sentence of a chunk that is already in the tree;
opinions, preferences and experiences live in their creator's perspective and
must not reach the readers of a shared summary). Each node summarises its
members (level 0) or its children's summaries (level > 0); nodes are clustered
again, level by level, until one node (the root) remains or
``raptor_max_levels`` is reached.

**Per scope set**, exactly like ``communities``: items shared into exactly the
same scopes form one tree whose nodes carry that scope set, so every reader of a
node may read everything it summarises. Only scope sets the bound identity may
write are built.

**Clustering**: k-means (scikit-learn, seeded, over unit-length vectors, so
cosine) into clusters of about ``raptor_cluster_size``; a cluster larger than
``raptor_max_cluster_size`` is split again. One k-means call makes at most
``FANOUT`` clusters and larger sets are split recursively, which keeps a full
build near ``n log n``.

**Centroids**: a leaf's is the mean of its members' embeddings; a higher node's
is the mean of its children's centroids. New content joins the leaf whose
centroid is nearest (cosine distance within ``raptor_join_distance``, while the
leaf has room); what joins nowhere is clustered into new leaves, and a node
without a parent joins the nearest parent with room (else new parents are made).

**Incremental**: deleted, archived or no longer embedded items leave their leaf;
a node whose members or children changed, or whose summary another method or
model made, is re-summarised; a node is re-summarised too when a child's summary
changed, so changes climb to the root. A node is written only when something
stored in it differs (members, children, parent, centroid, summary, method,
model); unchanged rows are not touched. An inserted or changed summary goes back
on the embedding queue (inserts start ``pending``; the requeue trigger resets
the embedding when ``summary`` changes). ``full=True`` deletes the scope set's
tree and builds it again from scratch.

One run is one transaction (the caller's) and one provenance activity; every
node made anew (inserted, or its members, children or summary changed) records
``wasDerivedFrom`` edges to all the chunks, fact contents or child nodes it
summarises, pinned to their current versions; a node rewritten only for its
centroid or parent keeps the edges of the summary it still carries. A run
killed midway rolls back, and the next run
starts from the last committed tree, so there is never a half tree or a
duplicate. A transaction-scoped advisory lock per tenant keeps two concurrent
runs from building the same tree twice.
"""

from __future__ import annotations

import math
import time
import uuid
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray
from pgvector.sqlalchemy import Vector
from sqlalchemy import LargeBinary, Table, any_, bindparam, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivations
from orchestrator.config import Settings, get_settings
from orchestrator.db.knowledge_models import FactContent, RaptorNode, current_claims
from orchestrator.db.models import EMBEDDING_DIMENSION, Chunk, Document
from orchestrator.derive import poison
from orchestrator.derive.quality import prose_or_all, prose_sentences, reader_text
from orchestrator.derive.summarize import Summarizer, get_summarizer, split_sentences
from orchestrator.errors import BadInput

Vec = NDArray[np.float64]
ScopeKey = tuple[uuid.UUID, ...]
Progress = Callable[[int, int], None]

CHUNKS = "sources.chunks"
FACTS = "knowledge.fact_content"
NODES = "memory.raptor_nodes"
# Most clusters one k-means call makes; larger sets are split recursively.
FANOUT = 32
# Vectors compared after a round trip through pgvector's float4.
CENTROID_TOLERANCE = 1e-5
EXTRACTOR_ROLE = "extractor"
EMPTY_SUMMARY = "A group of related passages."
# How a leaf's sentences are chosen (``_sentences``), recorded after the summarizer's method
# so a tree summarised under another rule is summarised again once: "+prose" (stop 41), a
# leaf's prose sentences only; before it, every sentence, code blocks, tables and "See also"
# link lists included ("```bash npm access list packages <org:team> ```."); "+prose2" (stop
# 42), the prose a reader sees: HTML comments and link reference definitions out before the
# text is cut into sentences (Node.js's API reference keeps each method's change history in
# a comment, and a sentence cut from its middle read "<!-- YAML added: v0.5.8 changes: -
# version: v5.0.0 pr-url: ...").
# "+prose3" (stop 49): as a reader sees it: a heading is no sentence, a list item starts one,
# and a sentence is served without Markdown markers, emphasis or link targets (a summary
# read "#### Example - Client connect event. * **upstream** `string` - ...").
# "+prose4" (stop 51): a parent from its children's prose sentences, and records are no
# prose (an overview read "... covers the café budget. root:x:0:0:root:/root:/bin/bash ...").
SENTENCES = "+prose4"
_BATCH = 5000
_UUIDS = ARRAY(UUID(as_uuid=True))


@dataclass
class RaptorReport:
    scope_sets: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    resummarised: int = 0
    joined: int = 0  # new items that joined an existing leaf
    levels: int = 0  # height of the tallest tree
    changed_ids: list[uuid.UUID] = field(default_factory=list)
    # Seconds per phase: read, plan (clustering and assignment), summarise, write, lineage.
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RaptorConfig:
    cluster_size: int
    max_cluster_size: int
    join_distance: float
    max_levels: int
    summary_sentences: int
    summary_chars: int
    seed: int
    # A leaf's prose sentences only (``derive_quality_gates``; off only to measure them).
    prose_only: bool = True


def config(settings: Settings) -> RaptorConfig:
    """The RAPTOR settings, checked; out-of-range values are refused with their variable name."""
    checks: list[tuple[str, float, float, float]] = [
        ("raptor_cluster_size", settings.raptor_cluster_size, 2, 1000),
        ("raptor_max_cluster_size", settings.raptor_max_cluster_size, settings.raptor_cluster_size, 10_000),
        ("raptor_join_distance", settings.raptor_join_distance, 0.0, 2.0),
        ("raptor_max_levels", settings.raptor_max_levels, 1, 64),
        ("raptor_summary_sentences", settings.raptor_summary_sentences, 1, 50),
        ("raptor_summary_chars", settings.raptor_summary_chars, 50, 20_000),
        ("raptor_seed", settings.raptor_seed, 0, 2**32 - 1),
    ]
    for name, value, low, high in checks:
        if not low <= value <= high:
            raise BadInput(f"{name} (ENGRAM_{name.upper()}) must be between {low:g} and {high:g}, "
                           f"got {value:g}")
    return RaptorConfig(settings.raptor_cluster_size, settings.raptor_max_cluster_size,
                        settings.raptor_join_distance, settings.raptor_max_levels,
                        settings.raptor_summary_sentences, settings.raptor_summary_chars,
                        settings.raptor_seed, settings.derive_quality_gates)


@dataclass(frozen=True)
class _Stored:
    parent_id: uuid.UUID | None
    children: tuple[uuid.UUID, ...]
    chunks: frozenset[uuid.UUID]
    facts: frozenset[uuid.UUID]
    summary: str
    method: str
    model: str | None
    centroid: Vec | None


@dataclass(eq=False)
class _Node:
    level: int
    id: uuid.UUID | None = None
    stored: _Stored | None = None
    parent: _Node | None = None
    chunks: set[uuid.UUID] = field(default_factory=set)
    facts: set[uuid.UUID] = field(default_factory=set)
    centroid: Vec | None = None
    summary: str = ""
    method: str = ""
    model: str | None = None
    members_changed: bool = False  # members (level 0) or children (level > 0)
    summarised: bool = False  # re-summarised in this run
    summary_changed: bool = False  # ... and the summary (text, method or model) came out different
    removed: bool = False


def _children(nodes: Iterable[_Node]) -> dict[int, list[_Node]]:
    """Live children per parent (keyed by ``id(parent)``), from the nodes' parent links."""
    kids: dict[int, list[_Node]] = defaultdict(list)
    for n in nodes:
        if n.parent is not None and not n.removed:
            kids[id(n.parent)].append(n)
    return kids


def _ids(nodes: Iterable[_Node]) -> tuple[uuid.UUID, ...]:
    return tuple(sorted(n.id for n in nodes if n.id is not None))


@dataclass
class _Tree:
    key: ScopeKey
    nodes: list[_Node]
    gone: list[_Node]  # stored nodes to delete
    chunk_vectors: dict[uuid.UUID, Vec] = field(default_factory=dict)
    fact_vectors: dict[uuid.UUID, Vec] = field(default_factory=dict)
    to_summarise: list[_Node] = field(default_factory=list)  # at most these are re-summarised
    joined: int = 0
    kids: dict[int, list[_Node]] = field(default_factory=dict)  # final structure, see _children
    recentred: set[int] = field(default_factory=set)  # id() of nodes whose centroid was recomputed

    def children(self, node: _Node) -> list[_Node]:
        return self.kids.get(id(node), [])

    def live(self, level: int | None = None) -> list[_Node]:
        return [n for n in self.nodes if not n.removed and (level is None or n.level == level)]


def _unit(vectors: Vec) -> Vec:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    out: Vec = vectors / np.where(norms > 0, norms, 1.0)
    return out


def _kmeans(vectors: Vec, k: int, seed: int) -> NDArray[np.int64]:
    from sklearn.cluster import KMeans  # type: ignore[import-untyped]

    with warnings.catch_warnings():
        # Fewer distinct points than clusters (duplicates) is handled by the caller.
        warnings.simplefilter("ignore")
        labels: NDArray[np.int64] = KMeans(n_clusters=k, n_init=1, max_iter=100,
                                           random_state=seed).fit_predict(vectors)
    return labels


def split(vectors: Vec, target: int, limit: int, seed: int) -> list[list[int]]:
    """Row indices of ``vectors`` in clusters of about ``target`` rows, none over ``limit``.

    Deterministic for the same input and seed; clusters are returned ordered by
    their smallest index.
    """
    # scikit-learn first: threadpoolctl limits only the thread pools already loaded.
    import sklearn.cluster  # type: ignore[import-untyped]  # noqa: F401
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    unit = _unit(vectors)
    out: list[list[int]] = []
    todo = [np.arange(len(vectors))]
    # One thread: most calls are small, and OpenMP's spinning workers on a busy machine
    # made the same split ten times slower (measured: 0.85 s against 8 to 11 s at 10k rows).
    with threadpool_limits(limits=1):
        _split_into(unit, todo, out, target, limit, seed)
    return sorted(out, key=min)


def _split_into(unit: Vec, todo: list[NDArray[np.int64]], out: list[list[int]], target: int, limit: int,
                seed: int) -> None:
    while todo:
        idx = todo.pop()
        want = math.ceil(len(idx) / target)
        if want <= 1:
            out.append(idx.tolist())
            continue
        k = min(want, FANOUT)
        labels = _kmeans(unit[idx], k, seed)
        groups = [idx[labels == c] for c in np.unique(labels)]
        if len(groups) == 1:  # identical vectors: k-means cannot separate them
            groups = [idx[i:i + target] for i in range(0, len(idx), target)]
        for g in groups:
            if len(g) <= limit:
                out.append(g.tolist())
            else:
                todo.append(g)


def _nearest_with_room(vectors: Vec, targets: Vec, room: NDArray[np.int64],
                       max_distance: float | None) -> list[int | None]:
    """For each vector in order, the nearest target (cosine) with room left, taking a place."""
    picks: list[int | None] = []
    if len(targets) == 0:
        return [None] * len(vectors)
    a, b = _unit(vectors), _unit(targets)
    for start in range(0, len(a), 256):
        for row in a[start:start + 256] @ b.T:
            masked = np.where(room > 0, row, -np.inf)
            j = int(np.argmax(masked))
            if room[j] > 0 and (max_distance is None or 1.0 - masked[j] <= max_distance):
                room[j] -= 1
                picks.append(j)
            else:
                picks.append(None)
    return picks


def _key(scopes: Iterable[uuid.UUID]) -> ScopeKey:
    return tuple(sorted(scopes))


def _writable(column: Any) -> Any:
    return column.contained_by(func.auth.write_scopes(type_=_UUIDS))


def _current_items(session: Session) -> dict[ScopeKey, tuple[set[uuid.UUID], set[uuid.UUID]]]:
    items: dict[ScopeKey, tuple[set[uuid.UUID], set[uuid.UUID]]] = defaultdict(lambda: (set(), set()))
    # Grouped by scope set in SQL: one row per scope set instead of one array per item.
    chunks = session.execute(
        select(Chunk.scopes, func.array_agg(Chunk.id))
        .join(Document, (Document.tenant_id == Chunk.tenant_id) & (Document.id == Chunk.document_id))
        .where(Document.archived_at.is_(None), Chunk.embed_state == "ready", _writable(Chunk.scopes))
        .group_by(Chunk.scopes)
    ).all()
    for scopes, ids in chunks:
        items[_key(scopes)][0].update(ids)
    c = current_claims.c
    facts = session.execute(
        select(c.scopes, func.array_agg(FactContent.id.distinct()))
        .join(FactContent, (FactContent.tenant_id == c.tenant_id) & (FactContent.id == c.content_id))
        .where(c.epistemic_kind == "world_fact", c.author_role != EXTRACTOR_ROLE,
               FactContent.embed_state == "ready", _writable(c.scopes))
        .group_by(c.scopes)
    ).all()
    for scopes, ids in facts:
        items[_key(scopes)][1].update(ids)
    return items


def _binary(vector: Any) -> Any:
    """A vector column in pgvector's binary form: parsing its text form costs ten times more."""
    return func.vector_send(vector, type_=LargeBinary)


def _decode(data: bytes | None) -> Vec | None:
    """``vector_send`` output: dimension (int16), a reserved int16, then big-endian float4s."""
    if data is None:
        return None
    dim = int.from_bytes(data[:2], "big")
    if len(data) != 4 + 4 * dim:
        raise ValueError(f"a binary vector of {dim} dimensions has {len(data)} bytes")
    out: Vec = np.frombuffer(data, dtype=">f4", offset=4).astype(np.float64)
    return out


def _stored_trees(session: Session) -> dict[ScopeKey, list[_Node]]:
    rows = session.execute(
        select(RaptorNode.id, RaptorNode.level, RaptorNode.parent_id, RaptorNode.children,
               RaptorNode.member_chunk_ids, RaptorNode.member_fact_ids,
               _binary(RaptorNode.centroid).label("centroid"),
               RaptorNode.summary, RaptorNode.summary_method, RaptorNode.summary_model, RaptorNode.scopes)
        .where(_writable(RaptorNode.scopes)).order_by(RaptorNode.level, RaptorNode.id)
    ).all()
    trees: dict[ScopeKey, list[_Node]] = defaultdict(list)
    parents: dict[uuid.UUID, uuid.UUID | None] = {}
    by_id: dict[uuid.UUID, tuple[_Node, ScopeKey]] = {}
    for r in rows:
        centroid = _decode(r.centroid)
        stored = _Stored(r.parent_id, tuple(sorted(r.children)), frozenset(r.member_chunk_ids),
                         frozenset(r.member_fact_ids), r.summary, r.summary_method, r.summary_model, centroid)
        node = _Node(r.level, r.id, stored, chunks=set(r.member_chunk_ids), facts=set(r.member_fact_ids),
                     centroid=centroid, summary=r.summary, method=r.summary_method, model=r.summary_model)
        trees[_key(r.scopes)].append(node)
        parents[r.id] = r.parent_id
        by_id[r.id] = (node, _key(r.scopes))
    for node, key in by_id.values():
        assert node.id is not None
        parent_id = parents[node.id]
        found = by_id.get(parent_id) if parent_id is not None else None
        # A parent in another tree or not one level up is no parent: the node is re-linked.
        if found is not None and found[1] == key and found[0].level == node.level + 1:
            node.parent = found[0]
    return trees


def _load(session: Session, column: Any, value: Any, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, Any]:
    wanted = sorted(ids)
    out: dict[uuid.UUID, Any] = {}
    for i in range(0, len(wanted), _BATCH):
        batch = bindparam(f"ids_{i}", wanted[i:i + _BATCH], type_=_UUIDS)
        for k, v in session.execute(select(column, value).where(column == any_(batch))):
            out[k] = v
    return out


def _load_vectors(session: Session, tree: _Tree, chunks: Iterable[uuid.UUID],
                  facts: Iterable[uuid.UUID]) -> None:
    need_c = {c for c in chunks if c not in tree.chunk_vectors}
    need_f = {f for f in facts if f not in tree.fact_vectors}
    for k, v in _load(session, Chunk.id, _binary(Chunk.embedding), need_c).items():
        tree.chunk_vectors[k] = _unbox(_decode(v))
    for k, v in _load(session, FactContent.id, _binary(FactContent.embedding), need_f).items():
        tree.fact_vectors[k] = _unbox(_decode(v))


def _unbox(v: Vec | None) -> Vec:
    assert v is not None, "items are read only with embed_state 'ready', which has an embedding"
    return v


def _leaf_centroid(tree: _Tree, node: _Node) -> Vec:
    vectors = [tree.chunk_vectors[c] for c in node.chunks] + [tree.fact_vectors[f] for f in node.facts]
    mean: Vec = np.mean(np.stack(vectors), axis=0)
    return mean


def _plan(session: Session, key: ScopeKey, stored: list[_Node], chunk_ids: set[uuid.UUID],
          fact_ids: set[uuid.UUID], cfg: RaptorConfig, summarizer: Summarizer, full: bool) -> _Tree:
    """Reconcile one scope set's stored tree with its current items; decide what to re-summarise."""
    tree = _Tree(key, [] if full else list(stored), list(stored) if full else [])

    # Leaves keep the members that are still current (each item in one leaf only).
    seen_c: set[uuid.UUID] = set()
    seen_f: set[uuid.UUID] = set()
    for leaf in tree.live(0):
        chunks, facts = (leaf.chunks & chunk_ids) - seen_c, (leaf.facts & fact_ids) - seen_f
        if (chunks, facts) != (leaf.chunks, leaf.facts) or leaf.centroid is None:
            leaf.chunks, leaf.facts, leaf.members_changed = chunks, facts, True
        seen_c |= chunks
        seen_f |= facts
    new_items = [(c, True) for c in sorted(chunk_ids - seen_c)]
    new_items += [(f, False) for f in sorted(fact_ids - seen_f)]
    _load_vectors(session, tree, (i for i, is_chunk in new_items if is_chunk),
                  (i for i, is_chunk in new_items if not is_chunk))
    vectors = np.zeros((0, EMBEDDING_DIMENSION))
    if new_items:
        vectors = np.stack([(tree.chunk_vectors if is_chunk else tree.fact_vectors)[i]
                            for i, is_chunk in new_items])

    # New items join the nearest leaf with room within the join distance.
    leaves = [n for n in tree.live(0) if n.centroid is not None and (n.chunks or n.facts)]
    left: list[int] = []
    if leaves:
        room = np.array([cfg.max_cluster_size - len(n.chunks) - len(n.facts) for n in leaves], dtype=np.int64)
        assert all(n.centroid is not None for n in leaves)
        centroids = np.stack([n.centroid for n in leaves if n.centroid is not None])
        for i, pick in enumerate(_nearest_with_room(vectors, centroids, room, cfg.join_distance)):
            if pick is None:
                left.append(i)
                continue
            item, is_chunk = new_items[i]
            (leaves[pick].chunks if is_chunk else leaves[pick].facts).add(item)
            leaves[pick].members_changed = True
            tree.joined += 1
    else:
        left = list(range(len(new_items)))
    # The rest form new leaves.
    if left:
        for group in split(vectors[left], cfg.cluster_size, cfg.max_cluster_size, cfg.seed):
            leaf = _Node(0, members_changed=True)
            for g in group:
                item, is_chunk = new_items[left[g]]
                (leaf.chunks if is_chunk else leaf.facts).add(item)
            tree.nodes.append(leaf)
    changed = []
    for leaf in tree.live(0):
        if not (leaf.chunks or leaf.facts):
            leaf.removed = True
        elif leaf.members_changed:
            changed.append(leaf)
    _load_vectors(session, tree, (c for n in changed for c in n.chunks),
                  (f for n in changed for f in n.facts))
    for leaf in changed:
        leaf.centroid = _leaf_centroid(tree, leaf)
        tree.recentred.add(id(leaf))

    _link_levels(tree, cfg)
    _mark_resummarise(tree, summarizer, cfg)
    return tree


def _link_levels(tree: _Tree, cfg: RaptorConfig) -> None:
    """Give every node below the top a parent, bottom-up; drop parents left without children."""
    level = 0
    while True:
        here = tree.live(level)
        for n in here:
            if n.parent is not None and n.parent.removed:
                n.parent = None
        above = tree.live(level + 1)
        if not here or (not above and len(here) == 1) or level + 1 >= cfg.max_levels:
            for n in here:  # the root, or the top level when the height is capped
                n.parent = None
            for n in tree.live():  # nothing left below them (everything under them went)
                if n.level > level:
                    n.removed = True
            break
        orphans = [n for n in here if n.parent is None]
        if orphans and above:
            counts = _children(here)
            room = np.array([cfg.max_cluster_size - len(counts.get(id(p), [])) for p in above],
                            dtype=np.int64)
            picks = _nearest_with_room(np.stack([_centroid(n) for n in orphans]),
                                       np.stack([_centroid(p) for p in above]), room, None)
            for n, pick in zip(orphans, picks, strict=True):
                if pick is not None:
                    n.parent = above[pick]
            orphans = [n for n in orphans if n.parent is None]
        if orphans:
            vectors = np.stack([_centroid(n) for n in orphans])
            for group in split(vectors, cfg.cluster_size, cfg.max_cluster_size, cfg.seed):
                parent = _Node(level + 1, members_changed=True)
                tree.nodes.append(parent)
                for g in group:
                    orphans[g].parent = parent
        kids = _children(here)
        for p in tree.live(level + 1):
            mine = kids.get(id(p), [])
            if not mine:
                p.removed = True
                continue
            if p.stored is None or any(k.id is None for k in mine) or _ids(mine) != p.stored.children:
                p.members_changed = True
            if p.members_changed or p.centroid is None or any(id(k) in tree.recentred for k in mine):
                p.centroid = np.mean(np.stack([_centroid(k) for k in mine]), axis=0)
                tree.recentred.add(id(p))
        level += 1
    # A root with a single child says nothing its child does not: the child becomes the root.
    while True:
        tops = [n for n in tree.live() if n.parent is None]
        if len(tops) != 1 or tops[0].level == 0:
            break
        only = _children(tree.nodes).get(id(tops[0]), [])
        if len(only) != 1:
            break
        tops[0].removed = True
        only[0].parent = None
    tree.gone.extend(n for n in tree.nodes if n.removed and n.id is not None)
    tree.nodes = [n for n in tree.nodes if not n.removed]
    tree.kids = {k: sorted(v, key=lambda n: (n.id is None, n.id or uuid.UUID(int=0)))
                 for k, v in _children(tree.nodes).items()}


def _centroid(node: _Node) -> Vec:
    assert node.centroid is not None, "centroids are computed bottom-up"
    return node.centroid


def _mark_resummarise(tree: _Tree, summarizer: Summarizer, cfg: RaptorConfig) -> None:
    """The nodes that may need a new summary: changed members, another method, or such a descendant."""
    wanted = (_method(summarizer.method, cfg), summarizer.model)
    touched: set[int] = set()
    for n in sorted(tree.nodes, key=lambda n: n.level):
        if n.members_changed or n.stored is None or (n.method, n.model) != wanted or any(
                id(k) in touched for k in tree.children(n)):
            tree.to_summarise.append(n)
            touched.add(id(n))


def _sentences(tree: _Tree, node: _Node, texts: dict[uuid.UUID, str], cfg: RaptorConfig
               ) -> list[str]:
    """What a node is summarised from: a leaf's members' prose sentences
    (``quality.prose_or_all``, ``plausible_statement``: no code block, table row, log line, list of links or
    number soup; a leaf with none keeps them all), cut from the text a reader sees
    (``quality.reader_text``: no HTML comment or link reference definition) and served as
    a reader sees them (``quality.prose_sentences``: no heading, no Markdown markers, emphasis
    or link targets; judged as written); every sentence
    of the text as stored with ``prose_only`` off; a higher node's children's summaries, their
    prose sentences where any has one (a leaf of ``/etc/passwd``'s lines is summarised by them,
    and its parent read "... covers the café budget. root:x:0:0:root:/root:/bin/bash daemon:x:1:1
    ..." among its other children's prose)."""
    if node.level == 0:
        members = sorted(node.chunks) + sorted(node.facts)
        if not cfg.prose_only:
            return [s for i in members for s in split_sentences(texts[i])]
        said = [pair for i in members for pair in prose_sentences(reader_text(texts[i]))]
        return [shown for _, shown in prose_or_all(said, written=lambda pair: pair[0])]
    summaries = [s for k in tree.children(node) for s in split_sentences(k.summary)]
    return prose_or_all(summaries) if cfg.prose_only else summaries


def _method(summarizer_method: str, cfg: RaptorConfig) -> str:
    """The method recorded for a node's summary: the summarizer's, and ``SENTENCES`` where a
    leaf's sentences are its prose."""
    return summarizer_method + SENTENCES if cfg.prose_only else summarizer_method


def _summarise(session: Session, trees: list[_Tree], summarizer: Summarizer, cfg: RaptorConfig,
               progress: Progress | None) -> int:
    """Re-summarise bottom-up; returns how many nodes were summarised.

    A node is summarised when its members or children changed, when another
    method or model made its summary, or when a child's summary came out
    different; a parent whose children all read as before keeps its summary
    (an abstractive endpoint is not asked again for the same input).
    """
    wanted = (_method(summarizer.method, cfg), summarizer.model)
    total = sum(len(t.to_summarise) for t in trees)
    done = summarised = 0
    for tree in trees:
        leaves = [n for n in tree.to_summarise if n.level == 0]
        texts: dict[uuid.UUID, str] = {}
        texts.update(_load(session, Chunk.id, Chunk.text, (c for n in leaves for c in n.chunks)))
        texts.update(_load(session, FactContent.id, FactContent.text, (f for n in leaves for f in n.facts)))
        for node in sorted(tree.to_summarise, key=lambda n: n.level):
            done += 1
            if node.members_changed or node.stored is None or (node.method, node.model) != wanted or any(
                    k.summary_changed for k in tree.children(node)):
                made = summarizer.summarize(_sentences(tree, node, texts, cfg),
                                            max_sentences=cfg.summary_sentences, max_chars=cfg.summary_chars)
                text = made.text or EMPTY_SUMMARY
                node.summarised = True
                summarised += 1
                method = _method(made.method, cfg)
                if (text, method, made.model) != (node.summary, node.method, node.model):
                    node.summary, node.method, node.model = text, method, made.model
                    node.summary_changed = True
            if progress is not None:
                progress(done, total)
    return summarised


def _differs(node: _Node, children: tuple[uuid.UUID, ...]) -> bool:
    s = node.stored
    if s is None:
        return True
    parent_id = node.parent.id if node.parent is not None else None
    if (s.parent_id, s.children, s.chunks, s.facts, s.summary, s.method, s.model) != (
            parent_id, children, frozenset(node.chunks), frozenset(node.facts), node.summary, node.method,
            node.model):
        return True
    if s.centroid is node.centroid:
        return False  # never recomputed: still the stored vector itself
    if s.centroid is None or node.centroid is None:
        return True
    # Every stored node is compared on every run: np.allclose cost a fifth of a run with
    # nothing to do at 10k chunks, a plain maximum is ten times cheaper.
    return bool(np.max(np.abs(s.centroid - node.centroid)) > CENTROID_TOLERANCE)


def _vector(v: Vec | None) -> list[float] | None:
    return None if v is None else [float(x) for x in v]


def _write(session: Session, tree: _Tree, report: RaptorReport) -> list[_Node]:
    """Insert new nodes bottom-up, link them, update changed ones, delete vanished ones."""
    written: list[_Node] = []
    levels = sorted({n.level for n in tree.nodes})
    for level in levels:
        new = [n for n in tree.nodes if n.level == level and n.id is None]
        if not new:
            continue
        rows = [{
            "level": n.level, "scopes": list(tree.key), "summary": n.summary, "summary_method": n.method,
            "summary_model": n.model, "member_chunk_ids": sorted(n.chunks),
            "member_fact_ids": sorted(n.facts),
            "centroid": _vector(n.centroid),
            "children": list(_ids(tree.children(n))),
            "parent_id": n.parent.id if n.parent is not None else None,
        } for n in new]
        ids = session.execute(insert(RaptorNode).returning(RaptorNode.id, sort_by_parameter_order=True),
                              rows).scalars().all()
        for n, nid in zip(new, ids, strict=True):
            n.id = nid
        written.extend(new)
        report.inserted += len(new)
    table = cast(Table, RaptorNode.__table__)
    links = [{"b_id": n.id, "b_parent": n.parent.id} for n in written
             if n.parent is not None and n.parent in written]
    if links:
        session.execute(update(table).where(table.c.id == bindparam("b_id"))
                        .values(parent_id=bindparam("b_parent")), links)
    changes = []
    for n in tree.nodes:
        if n.stored is None:
            continue
        children = _ids(tree.children(n))
        if not _differs(n, children):
            report.unchanged += 1
            continue
        changes.append({
            "b_id": n.id, "b_parent": n.parent.id if n.parent is not None else None,
            "b_children": list(children), "b_summary": n.summary, "b_method": n.method, "b_model": n.model,
            "b_chunks": sorted(n.chunks), "b_facts": sorted(n.facts), "b_centroid": _vector(n.centroid)})
        written.append(n)
        report.updated += 1
    if changes:
        session.execute(update(table).where(table.c.id == bindparam("b_id")).values(
            parent_id=bindparam("b_parent"), children=bindparam("b_children", type_=_UUIDS),
            summary=bindparam("b_summary"), summary_method=bindparam("b_method"),
            summary_model=bindparam("b_model"), member_chunk_ids=bindparam("b_chunks", type_=_UUIDS),
            member_fact_ids=bindparam("b_facts", type_=_UUIDS),
            centroid=bindparam("b_centroid", type_=Vector(EMBEDDING_DIMENSION)),
            updated_at=func.now()), changes)
    if tree.gone:
        gone = [n.id for n in tree.gone]
        session.execute(delete(RaptorNode).where(
            RaptorNode.id == any_(bindparam("gone", gone, type_=_UUIDS))))
        report.deleted += len(gone)
    return written


def _derivations(session: Session, tree: _Tree, written: list[_Node]) -> None:
    """``wasDerivedFrom`` edges from each node made anew to everything it summarises (pinned versions).

    Made anew: inserted, its members or children changed, or its summary changed. A
    node rewritten only because a descendant moved its centroid or it got another
    parent keeps the edges of the summary it still carries.
    """
    edges = []
    for n in written:
        if not (n.stored is None or n.members_changed or n.summary_changed):
            continue
        derived = (NODES, {"id": str(n.id)})
        sources = [(CHUNKS, c) for c in sorted(n.chunks)] + [(FACTS, f) for f in sorted(n.facts)]
        sources += [(NODES, k.id) for k in tree.children(n) if k.id is not None]
        edges += [(derived, (table, {"id": str(i)})) for table, i in sources]
    # A full build records one edge per chunk: batched, not one round trip each.
    record_derivations(session, edges)


def build(session: Session, *, full: bool = False, settings: Settings | None = None,
          on_progress: Progress | None = None) -> RaptorReport:
    """Bring every writable scope set's RAPTOR tree up to date (``full``: rebuild from scratch).

    ``on_progress(done, total)`` is called after each summary (for a progress bar).
    """
    settings = settings or get_settings()
    cfg = config(settings)
    summarizer = get_summarizer(settings)
    # One run per tenant at a time: a second waits, then sees the first's tree.
    report = RaptorReport()
    clock = time.perf_counter()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        report.seconds[phase] = report.seconds.get(phase, 0.0) + now - clock
        clock = now

    session.execute(select(func.pg_advisory_xact_lock(
        func.hashtextextended(func.concat("engram.derive.raptor:", func.auth.tenant_id()), 0))))
    items = _current_items(session)
    stored = _stored_trees(session)
    lap("read")
    trees = []
    for key in sorted(set(items) | set(stored)):
        chunk_ids, fact_ids = items.get(key, (set(), set()))
        trees.append(_plan(session, key, stored.get(key, []), chunk_ids, fact_ids, cfg, summarizer, full))
    report.scope_sets = len(trees)
    report.joined = sum(t.joined for t in trees)
    lap("plan")
    report.resummarised = _summarise(session, trees, summarizer, cfg, on_progress)
    lap("summarise")
    started = False
    for tree in trees:
        report.levels = max([report.levels, *(n.level + 1 for n in tree.nodes)])
        pending = tree.gone or any(_differs(n, _ids(tree.children(n))) for n in tree.nodes)
        if not pending:
            report.unchanged += len(tree.nodes)
            continue
        if not started:
            begin_activity(session, "derive.raptor", {
                "method": summarizer.method, "model": summarizer.model, "full": full,
                "cluster_size": cfg.cluster_size, "max_cluster_size": cfg.max_cluster_size,
                "join_distance": cfg.join_distance, "seed": cfg.seed})
            started = True
        lap("summarise")
        with poison.item(session, f"the RAPTOR tree of scope set {', '.join(map(str, tree.key))}",
                         restore=report):
            written = _write(session, tree, report)
            lap("write")
            _derivations(session, tree, written)
            lap("lineage")
            report.changed_ids.extend(n.id for n in written if n.id is not None)
    if started:
        end_activity(session)
    return report
