"""Plan shapes: which lanes a recall statement contains.

Production always runs ``FULL_PLAN`` (every lane on; there is no query-time
router, because a misrouted query loses evidence the reranker cannot recover).
The narrower shapes in ``PLAN_STUDY`` are the historical plans, kept
constructible from the same builder so an evaluation can compare them side by
side; nothing in the request path chooses among them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class PlanShape:
    name: str
    dense: bool = True
    lexical: bool = True
    title: bool = True
    catalogs: bool = True
    graph: bool = True
    rerank: bool = True

    def without(self, name: str, **lanes: bool) -> PlanShape:
        return replace(self, name=name, **lanes)


FULL_PLAN = PlanShape("full")

PLAN_STUDY: dict[str, PlanShape] = {
    shape.name: shape
    for shape in (
        FULL_PLAN,
        FULL_PLAN.without("dense-only", lexical=False, title=False, catalogs=False, graph=False,
                          rerank=False),
        FULL_PLAN.without("bm25-only", dense=False, title=False, catalogs=False, graph=False,
                          rerank=False),
        FULL_PLAN.without("hybrid-no-graph", graph=False),
        FULL_PLAN.without("no-title", title=False),
        FULL_PLAN.without("no-reranker", rerank=False),
    )
}
