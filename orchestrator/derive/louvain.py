"""Louvain community detection that can start from an earlier hierarchy.

The communities job reruns clustering after every change to the relation graph. Louvain
from scratch is a global computation: one new edge can move a boundary anywhere in its
component, and every community whose members move must be summarised and written again.
Started from the previous run's hierarchy instead, each level begins at the partition it
ended at last time and only nodes with a better community move, so a small change to the
graph moves few members and a graph that did not change is a fixed point (the partition
comes back exactly).

The algorithm is the usual one (Blondel et al. 2008), deterministic:

* **local moving** with a queue (as in Leiden's fast local move): every node once, then the
  neighbours of each node that moved; when the queue runs dry after moves, every node
  again, until a whole sweep moves nothing (a true local optimum, so that the result
  started from itself comes back unchanged). A node joins the
  neighbouring community with the largest gain ``k_u,C - resolution * tot_C * k_u / 2m``
  (ties: the smaller label), or a community of its own when every gain is negative;
* **aggregation**: each community becomes a node, edges inside it a self-loop;
* the next **level** clusters the aggregate graph; it starts from the labels the earlier
  hierarchy gave that level (the label most of a community's members had), or from
  singletons. The hierarchy ends at the first level that merges nothing;
* a warm start is checked against a fresh run (``hierarchy``'s ``drift``): local moving
  cannot split a community in two, so a warm start that fell behind is replaced.

Nodes are visited in the order they are given, so the caller fixes the order (sorted ids).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

EPS = 1e-10
DRIFT = 0.01  # modularity a warm start may lose against a fresh run before the fresh one wins


@dataclass
class WeightedGraph:
    """An undirected weighted graph over the nodes ``0..n-1``; ``loops[i]`` is i's self-loop weight."""

    n: int
    adj: list[dict[int, float]] = field(default_factory=list)
    loops: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.adj = self.adj or [{} for _ in range(self.n)]
        self.loops = self.loops or [0.0] * self.n

    def add_edge(self, u: int, v: int, weight: float) -> None:
        if u == v:
            self.loops[u] += weight
            return
        self.adj[u][v] = self.adj[u].get(v, 0.0) + weight
        self.adj[v][u] = self.adj[v].get(u, 0.0) + weight

    def degrees(self) -> list[float]:
        return [sum(a.values()) + 2 * loop for a, loop in zip(self.adj, self.loops, strict=True)]


def move_nodes(graph: WeightedGraph, labels: list[int], resolution: float = 1.0) -> list[int]:
    """Local moving from ``labels`` (one int per node) until no move raises modularity."""
    labels = list(labels)
    degree = graph.degrees()
    m2 = sum(degree)
    if m2 == 0:
        return labels
    tot: dict[int, float] = {}
    for node, label in enumerate(labels):
        tot[label] = tot.get(label, 0.0) + degree[node]
    fresh = max(labels, default=-1) + 1
    queue = deque(range(graph.n))
    queued = [True] * graph.n
    moves = 0
    while queue or moves:
        if not queue:  # a full sweep confirms the optimum (the queue misses some nodes' changes)
            queue.extend(range(graph.n))
            queued = [True] * graph.n
            moves = 0
        u = queue.popleft()
        queued[u] = False
        current = labels[u]
        links: dict[int, float] = {}
        for v, w in graph.adj[u].items():
            links[labels[v]] = links.get(labels[v], 0.0) + w
        share = resolution * degree[u] / m2
        tot[current] -= degree[u]
        best, best_gain = current, links.get(current, 0.0) - tot[current] * share
        for label in sorted(links):
            gain = links[label] - tot[label] * share
            if gain > best_gain + EPS:
                best, best_gain = label, gain
        if best_gain < -EPS:  # worse than a community of its own
            best, fresh = fresh, fresh + 1
        tot[best] = tot.get(best, 0.0) + degree[u]
        if best == current:
            continue
        labels[u] = best
        moves += 1
        for v in graph.adj[u]:
            if labels[v] != best and not queued[v]:
                queue.append(v)
                queued[v] = True
    return labels


def aggregate(graph: WeightedGraph, labels: Sequence[int]) -> tuple[WeightedGraph, list[int]]:
    """The graph of communities, and each node's community index (numbered by first node)."""
    index: dict[int, int] = {}
    of = [index.setdefault(label, len(index)) for label in labels]
    up = WeightedGraph(len(index))
    for u in range(graph.n):
        cu = of[u]
        up.loops[cu] += graph.loops[u]
        for v, w in graph.adj[u].items():
            if v < u:
                continue
            if of[v] == cu:
                up.loops[cu] += w
            else:
                up.add_edge(cu, of[v], w)
    return up, of


def modularity(graph: WeightedGraph, labels: Sequence[int], resolution: float = 1.0) -> float:
    """Newman's modularity of a partition (``labels``: a community per node)."""
    degree = graph.degrees()
    m2 = sum(degree)
    if m2 == 0:
        return 0.0
    inside: dict[int, float] = {}
    tot: dict[int, float] = {}
    for u in range(graph.n):
        c = labels[u]
        tot[c] = tot.get(c, 0.0) + degree[u]
        inside[c] = inside.get(c, 0.0) + 2 * graph.loops[u] + sum(
            w for v, w in graph.adj[u].items() if labels[v] == c)
    return sum(inside.get(c, 0.0) / m2 - resolution * (t / m2) ** 2 for c, t in tot.items())


def hierarchy(graph: WeightedGraph, max_levels: int,
              previous: Sequence[Sequence[Hashable | None]] = (),
              resolution: float = 1.0, drift: float = DRIFT) -> list[list[int]]:
    """Louvain's levels as partitions of the original nodes (a community index per node).

    ``previous[k][i]`` is node i's community at level k in an earlier hierarchy (any hashable
    label; None: none, a community of its own). Level k starts from those labels where given.
    Single-node moves cannot split a community that should now be two, so a warm start can
    drift from what Louvain would find afresh: the hierarchy from singletons is computed
    too, and the warm one is kept only while the modularity of its finest and of its
    coarsest level is within ``drift`` of the fresh one's.
    """
    fresh = _levels(graph, max_levels, (), resolution)
    if not previous:
        return fresh
    warm = _levels(graph, max_levels, previous, resolution)
    if not warm or not fresh:
        return fresh

    def q(levels: list[list[int]], at: int) -> float:
        return modularity(graph, levels[at], resolution)

    if q(warm, 0) < q(fresh, 0) - drift or q(warm, -1) < q(fresh, -1) - drift:
        return fresh
    return warm


def _levels(graph: WeightedGraph, max_levels: int, previous: Sequence[Sequence[Hashable | None]],
            resolution: float) -> list[list[int]]:
    levels: list[list[int]] = []
    current = graph
    members: list[list[int]] = [[i] for i in range(graph.n)]  # current's nodes as original nodes
    while len(levels) < max_levels and current.n > 1:
        start = _start(members, previous[len(levels)] if len(levels) < len(previous) else None)
        labels = move_nodes(current, start, resolution)
        current, of = aggregate(current, labels)
        if current.n == len(members):
            break  # nothing merged: the hierarchy ends
        grouped: list[list[int]] = [[] for _ in range(current.n)]
        for node, community in enumerate(of):
            grouped[community] += members[node]
        members = grouped
        level = [0] * graph.n
        for community, nodes in enumerate(members):
            for node in nodes:
                level[node] = community
        levels.append(level)
    return levels


def _start(members: list[list[int]], previous: Sequence[Hashable | None] | None) -> list[int]:
    """Each node's starting label: the earlier label most of its members had, else its own."""
    if previous is None:
        return list(range(len(members)))
    numbered: dict[Hashable, int] = {}
    start = []
    for node, nodes in enumerate(members):
        votes: dict[Hashable, int] = {}
        for original in nodes:
            label = previous[original]
            if label is not None:
                votes[label] = votes.get(label, 0) + 1
        if not votes:
            start.append(len(members) + node)  # a label no earlier community has
            continue
        # most members; ties: the label seen first, so the choice does not depend on hashing
        top = max(votes.values())
        label = next(x for x in votes if votes[x] == top)
        start.append(numbered.setdefault(label, len(numbered)))
    return start
