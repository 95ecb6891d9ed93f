"""Louvain with a warm start: quality against networkx, fixed points, locality of small changes."""

from __future__ import annotations

import itertools
import random

import networkx as nx  # type: ignore[import-untyped]
import pytest

from orchestrator.derive.louvain import DRIFT, WeightedGraph, aggregate, hierarchy, modularity, move_nodes


def _graph(g: nx.Graph) -> tuple[WeightedGraph, list[int]]:
    nodes = sorted(g.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    out = WeightedGraph(len(nodes))
    for u, v, w in sorted(g.edges(data="weight", default=1.0)):
        out.add_edge(index[u], index[v], float(w))
    return out, nodes


def _partition(labels: list[int], nodes: list[int]) -> list[set[int]]:
    groups: dict[int, set[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, set()).add(nodes[i])
    return list(groups.values())


def _blocks(sizes: tuple[int, ...] = (12,) * 8) -> nx.Graph:
    return nx.random_partition_graph(list(sizes), 0.6, 0.01, seed=7)


def test_two_triangles_joined_by_one_edge_are_two_communities() -> None:
    g = WeightedGraph(6)
    for u, v in [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5), (2, 3)]:
        g.add_edge(u, v, 1.0)
    levels = hierarchy(g, max_levels=8)
    assert len(levels) == 1  # the two triangles do not merge: that would lower modularity
    assert _partition(levels[0], list(range(6))) == [{0, 1, 2}, {3, 4, 5}]


@pytest.mark.parametrize("make", [nx.karate_club_graph, _blocks, lambda: nx.les_miserables_graph()])
def test_modularity_matches_networkx_louvain(make: object) -> None:
    g = make()  # type: ignore[operator]
    ours, nodes = _graph(g)
    levels = hierarchy(ours, max_levels=8)
    q = nx.community.modularity(g, _partition(levels[-1], nodes), weight="weight")
    reference = max(nx.community.modularity(g, nx.community.louvain_communities(g, weight="weight", seed=s),
                                            weight="weight") for s in range(5))
    assert q >= reference - 0.02, (q, reference)
    # each level merges the one below it
    for low, high in itertools.pairwise(levels):
        assert len(set(high)) < len(set(low))
        above: dict[int, set[int]] = {}
        for a, b in zip(low, high, strict=True):
            above.setdefault(a, set()).add(b)
        assert all(len(b) == 1 for b in above.values())  # a community lies inside one above it


def test_planted_blocks_are_found_exactly() -> None:
    g = _blocks()
    ours, nodes = _graph(g)
    found = _partition(hierarchy(ours, max_levels=8)[-1], nodes)
    assert sorted(map(sorted, found)) == sorted(map(sorted, g.graph["partition"]))


def _changed(before: list[int], after: list[int]) -> int:
    """How many communities of ``after`` are not exactly a community of ``before``."""
    def groups(labels: list[int]) -> set[frozenset[int]]:
        out: dict[int, set[int]] = {}
        for i, label in enumerate(labels):
            out.setdefault(label, set()).add(i)
        return {frozenset(g) for g in out.values()}
    return len(groups(after) - groups(before))


def _powerlaw() -> tuple[WeightedGraph, list[int]]:
    return _graph(nx.powerlaw_cluster_graph(3000, 3, 0.3, seed=1))


def test_a_hierarchy_started_from_itself_comes_back_unchanged() -> None:
    ours, _ = _powerlaw()
    first = hierarchy(ours, max_levels=8)
    assert len(first) >= 3
    again = hierarchy(ours, max_levels=8, previous=first)
    assert len(again) == len(first)
    assert all(_changed(a, b) == 0 for a, b in zip(first, again, strict=True))


def test_a_small_change_moves_few_communities_from_the_warm_start() -> None:
    ours, _ = _powerlaw()
    first = hierarchy(ours, max_levels=8)
    rng = random.Random(1)
    for _ in range(10):  # 10 new edges in 8,991
        u, v = rng.sample(range(ours.n), 2)
        ours.add_edge(u, v, 1.0)
    warm = hierarchy(ours, max_levels=8, previous=first)
    fresh = hierarchy(ours, max_levels=8)
    assert len(warm) >= 2 and len(fresh) >= 2
    warm_changed, fresh_changed = _changed(first[0], warm[0]), _changed(first[0], fresh[0])
    assert warm_changed <= 2 * 10, warm_changed  # at most both ends' communities per new edge
    assert warm_changed * 3 < fresh_changed, (warm_changed, fresh_changed)
    assert _changed(first[1], warm[1]) * 2 < _changed(first[1], fresh[1])
    assert modularity(ours, warm[-1]) >= modularity(ours, fresh[-1]) - DRIFT


def test_a_bad_start_is_repaired() -> None:
    """Everything starting in one community: local moving splits what should not be together."""
    g = WeightedGraph(6)
    for u, v in [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5), (2, 3)]:
        g.add_edge(u, v, 1.0)
    stuck = move_nodes(g, [0] * 6)  # no single node can leave without lowering modularity
    assert _partition(stuck, list(range(6))) == [{0, 1, 2, 3, 4, 5}]
    assert modularity(g, stuck) < modularity(g, [0, 0, 0, 1, 1, 1])
    # the hierarchy compares the warm start with a fresh run and keeps the better one
    assert hierarchy(g, max_levels=8, previous=[[0] * 6]) == [[0, 0, 0, 1, 1, 1]]
    assert hierarchy(g, max_levels=8, previous=[["x", "x", "x", "x", "x", None]]) == [[0, 0, 0, 1, 1, 1]]


def test_aggregation_keeps_every_weight() -> None:
    g = nx.les_miserables_graph()
    ours, _ = _graph(g)
    labels = move_nodes(ours, list(range(ours.n)))
    up, of = aggregate(ours, labels)
    assert sum(up.degrees()) == pytest.approx(sum(ours.degrees()))
    assert up.n == len(set(labels)) and len(of) == ours.n
    inside = sum(w for u in range(ours.n) for v, w in ours.adj[u].items() if u < v and labels[u] == labels[v])
    assert sum(up.loops) == pytest.approx(inside)
    # modularity is a property of the partition, not of how the graph was aggregated
    assert modularity(up, list(range(up.n))) == pytest.approx(modularity(ours, labels))
    assert modularity(ours, labels) == pytest.approx(
        nx.community.modularity(g, _partition(labels, sorted(g.nodes)), weight="weight"))


def test_graph_without_edges_has_no_levels() -> None:
    assert hierarchy(WeightedGraph(4), max_levels=8) == []
    assert move_nodes(WeightedGraph(3), [0, 1, 2]) == [0, 1, 2]
