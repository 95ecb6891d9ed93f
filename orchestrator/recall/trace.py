"""The recall trace: what every stage saw, for people debugging a recall.

Investigate in this order: candidate pool (was the item found by any lane?),
hydration (did its document join, or was it archived/snoozed?), rendering (did
the answer fit inside what was rendered?), and only then ranking. The trace is
built from the same rows the recall used, so it shows exactly what the bound
identity could see and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.recall.tail import Candidate


@dataclass(frozen=True)
class TraceItem:
    key: str
    kind: str
    label: str
    direct: bool
    pinned: bool
    lanes: dict[str, Any]
    rrf: float
    rerank: float | None
    merit: float


def item(c: Candidate) -> TraceItem:
    label = c.kind if c.source is None else f"{c.source.title} #{c.chunk_id}"
    return TraceItem(c.key, c.kind, label, c.direct, c.pinned, dict(c.lanes), c.rrf, c.rerank,
                     c.merit)


@dataclass
class Trace:
    question: str
    asker: str | None
    plan: str
    mode: str | None
    budget_tokens: int
    timings_ms: dict[str, float] = field(default_factory=dict)
    corpus: dict[str, Any] = field(default_factory=dict)
    pools: dict[str, list[TraceItem]] = field(default_factory=dict)
    fused: list[TraceItem] = field(default_factory=list)
    reranker: str = ""
    ordered: list[TraceItem] = field(default_factory=list)
    suppressed: list[tuple[str, str, float]] = field(default_factory=list)
    kept: int = 0
    used_tokens: int = 0
    statements: int = 0

    def format(self) -> str:
        lines = [f"recall trace: {self.question!r}" + (f" asked by {self.asker}" if self.asker
                                                        else ""),
                 f"plan {self.plan}; mode {self.mode or 'none'}; budget {self.budget_tokens} "
                 f"tokens; {self.statements} statement(s) after binding the identity"]
        if self.corpus:
            lines.append(f"lexical corpus (visible): {self.corpus.get('chunks')} chunks, average "
                         f"length {self._num(self.corpus.get('avg_length'))}")
        lines.append("1. candidate pools")
        for lane, items in self.pools.items():
            lines.append(f"   {lane}: {len(items)}")
            for it in items:
                score = {"dense": "dense_distance", "lexical": "bm25"}.get(lane)
                rank = {"dense": "dense_rank", "lexical": "lexical_rank",
                        "title": "title_rank"}.get(lane)
                parts = []
                if rank:
                    parts.append(f"rank {it.lanes.get(rank)}")
                if score:
                    parts.append(f"{score} {self._num(it.lanes.get(score))}")
                if lane == "title":
                    parts.append("direct subject" if it.direct else "contained in a longer title")
                lines.append(f"     {it.label}: " + ", ".join(parts))
        lines.append(f"2. fusion (RRF) and hydration: {len(self.fused)} candidates")
        for it in self.fused:
            lines.append(f"     {it.label}: rrf {self._num(it.rrf)}" +
                         (" [direct]" if it.direct else "") + (" [pinned]" if it.pinned else ""))
        lines.append(f"3. reranker: {self.reranker}")
        lines.append("4. order (direct subjects first, then merit)")
        for n, it in enumerate(self.ordered, 1):
            rr = "" if it.rerank is None else f", rerank {self._num(it.rerank)}"
            lines.append(f"     {n}. {it.label}: merit {self._num(it.merit)}{rr}" +
                         (" [direct]" if it.direct else ""))
        for dropped, twin, sim in self.suppressed:
            lines.append(f"     suppressed {dropped}: near-duplicate of {twin} ({sim:.3f})")
        lines.append(f"5. budget: kept the first {self.kept} of {len(self.ordered)}, "
                     f"{self.used_tokens} of {self.budget_tokens} tokens")
        lines.append("timings: " + ", ".join(f"{k} {v:.1f} ms" for k, v in self.timings_ms.items()))
        return "\n".join(lines)

    @staticmethod
    def _num(v: Any) -> str:
        return "-" if v is None else f"{float(v):.6f}"
