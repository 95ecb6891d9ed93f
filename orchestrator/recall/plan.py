"""Plan shapes: which lanes a recall statement contains.

Production always runs ``FULL_PLAN`` (every lane on; there is no query-time
router, because a misrouted query loses evidence the reranker cannot recover).
The narrower shapes in ``PLAN_STUDY`` (and the ``learned``/``fused`` pair, which
differ only in whether the learned ranker orders the candidates) are the historical plans, kept
constructible from the same builder so an evaluation can compare them side by
side; nothing in the request path chooses among them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

# The lanes a shape can switch, in the order the statement lays them out.
SOURCE_LANES = ("dense", "lexical", "title")
MEMORY_LANES = ("facts", "keyed", "graph", "communities", "raptor", "working_memory", "profiles",
                "episodes", "observations", "decisions", "causal", "timeline")


@dataclass(frozen=True)
class PlanShape:
    name: str
    dense: bool = True
    lexical: bool = True
    title: bool = True
    catalogs: bool = True
    facts: bool = True
    keyed: bool = True
    graph: bool = True
    communities: bool = True
    raptor: bool = True
    working_memory: bool = True
    profiles: bool = True
    episodes: bool = True
    observations: bool = True
    decisions: bool = True
    causal: bool = True
    timeline: bool = True
    rerank: bool = True
    # The learned ranker (recall.ranker) orders the candidates; off: fused (RRF) order.
    learned: bool = True

    def without(self, name: str, **lanes: bool) -> PlanShape:
        return replace(self, name=name, **lanes)

    def only(self, name: str, *lanes: str, rerank: bool = False) -> PlanShape:
        """A shape with just ``lanes`` on; the cross-encoder and the learned ranker as ``rerank``
        says (the single-lane shapes show a lane's own order)."""
        switches = {f.name: f.name in lanes for f in fields(self) if f.name not in SWITCHES}
        unknown = set(lanes) - set(switches)
        if unknown:
            raise ValueError(f"unknown lanes: {sorted(unknown)}")
        return replace(self, name=name, rerank=rerank, learned=rerank, **switches)

    @property
    def lanes(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self)
                     if f.name not in SWITCHES and getattr(self, f.name))

    def same_plan(self, other: PlanShape) -> bool:
        """Whether two shapes run exactly the same plan (only their names differ)."""
        return replace(self, name="") == replace(other, name="")


# Fields of a shape that are not lanes.
SWITCHES = ("name", "rerank", "learned")

FULL_PLAN = PlanShape("full")

PLAN_STUDY: dict[str, PlanShape] = {
    shape.name: shape
    for shape in (
        FULL_PLAN,
        FULL_PLAN.only("dense-only", "dense"),
        FULL_PLAN.only("bm25-only", "lexical"),
        FULL_PLAN.only("hybrid", "dense", "lexical"),
        FULL_PLAN.only("sources", "dense", "lexical", "title", "catalogs", rerank=True),
        FULL_PLAN.without("hybrid-no-graph", graph=False, communities=False),
        FULL_PLAN.without("no-title", title=False),
        FULL_PLAN.without("no-memory", **dict.fromkeys(MEMORY_LANES, False)),
        FULL_PLAN.without("no-timeline", timeline=False),
        FULL_PLAN.without("no-reranker", rerank=False),
        # The learned ranker against fused (RRF) order, everything else equal.
        FULL_PLAN.without("learned"),
        FULL_PLAN.without("fused", learned=False),
    )
}
