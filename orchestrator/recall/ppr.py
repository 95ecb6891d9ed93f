"""Personalized PageRank over the recall's entity/claim subgraph, seeded by the question's entities.

Order of work (``personalized_pagerank``):

1. **the bounded subgraph**: the entity seeds the statement found (named in the
   question), the subject and object of every claim in the pool (the facts,
   keyed and graph lanes; the graph lane's walk is already bounded by depth,
   fan-out and size in the statement), the claims themselves, and every other
   candidate (a chunk, a summary, an observation...) linked to each of those
   entities its text names. Nothing is read from the database: the graph is made
   of what the caller's RLS already let into the pool, so it cannot reach a row
   the caller may not see;
2. **the walk**: a random walk that restarts at the seeds with probability
   ``restart`` at every step, iterated ``iterations`` times at most (stops early
   when the distribution moves less than ``tolerance``); each node's mass is the
   share of time the walk spends there, so a claim two hops from a seed scores
   above one the seeds cannot reach at all (which scores 0);
3. **scores by candidate key**, for the learned ranker's ``ppr`` feature and the
   trace.

Why in Python and not in the statement: the subgraph is at most a few hundred
nodes (the candidate pool plus their entities), a dense power iteration over it
costs well under a millisecond, and the statement stays one bounded walk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.recall.features import names_in, prepare_names
from orchestrator.recall.tail import CLAIMS, Candidate

RESTART = 0.15
ITERATIONS = 30
TOLERANCE = 1e-6


@dataclass
class PprResult:
    scores: dict[str, float] = field(default_factory=dict)  # candidate key -> mass
    nodes: int = 0
    edges: int = 0
    iterations: int = 0
    note: str = ""


def _norm(name: str | None) -> str:
    return " ".join((name or "").lower().split())


def personalized_pagerank(candidates: Sequence[Candidate], seeds: Sequence[str], *,
                          restart: float = RESTART, iterations: int = ITERATIONS,
                          tolerance: float = TOLERANCE) -> PprResult:
    """PPR mass of every candidate, restarting at the entities named ``seeds``."""
    seed_names = {_norm(s) for s in seeds if _norm(s)}
    if not seed_names:
        return PprResult(note="no entity seeds in the question")
    entities: dict[str, int] = {}

    def entity(name: str) -> int:
        return entities.setdefault(name, len(entities))

    for s in sorted(seed_names):
        entity(s)
    claim_links: list[tuple[int, list[int]]] = []  # (candidate index, entity ids)
    for i, c in enumerate(candidates):
        if c.item_table == CLAIMS and c.fact is not None:
            ends = [entity(n) for n in (_norm(c.fact.subject), _norm(c.fact.object)) if n]
            claim_links.append((i, ends))
    text_links: list[tuple[int, list[int]]] = []
    names = prepare_names(entities)
    for i, c in enumerate(candidates):
        if c.item_table == CLAIMS and c.fact is not None:
            continue
        found = names_in(c.text, names)
        if found:
            text_links.append((i, sorted(entities[m] for m in found)))
    links = claim_links + text_links
    if not any(ends for _, ends in links):
        return PprResult(nodes=len(entities), note="no candidate links to the seeds' subgraph")
    # Nodes: the entities, then only the candidates with a link (the rest score 0).
    n_ent = len(entities)
    linked = [i for i, ends in links if ends]
    node_of = {i: n_ent + k for k, i in enumerate(linked)}
    n = n_ent + len(linked)
    rows = np.array([node_of[i] for i, ends in links for _ in ends], dtype=np.int64)
    cols = np.array([e for _, ends in links for e in ends], dtype=np.int64)
    adj = np.zeros((n, n), dtype=np.float64)
    adj[rows, cols] = 1.0
    adj[cols, rows] = 1.0
    degree = adj.sum(axis=1)
    # Column-stochastic transitions; a node without edges keeps its mass at the restart.
    step: np.ndarray[Any, Any] = np.divide(adj, degree[None, :], out=np.zeros_like(adj),
                                           where=degree[None, :] > 0)
    start = np.zeros(n)
    for s in seed_names:
        start[entities[s]] = 1.0
    start /= start.sum()
    p = start.copy()
    done = 0
    for done in range(1, iterations + 1):  # noqa: B007 - the count is reported
        nxt = restart * start + (1.0 - restart) * (step @ p)
        dangling = 1.0 - nxt.sum()  # mass that sat on isolated nodes goes back to the seeds
        nxt += dangling * start
        moved = float(np.abs(nxt - p).sum())
        p = nxt
        if moved < tolerance:
            break
    mass = p[n_ent:].tolist()
    scores = {candidates[i].key: m for i, m in zip(linked, mass, strict=True) if m > 0}
    return PprResult(scores=scores, nodes=n, edges=len(rows), iterations=done)
