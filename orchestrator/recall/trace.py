"""The recall trace: what every stage saw, for people debugging a recall.

Investigate in this order: candidate pool (was the item found by any lane?),
hydration (did its document join, or was it archived/snoozed?), rendering (did
the answer fit inside what was rendered?), and only then ranking. The trace is
built from the same rows the recall used, so it shows exactly what the bound
identity could see and nothing else.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator.messages import near_duplicate, nothing_served, shown
from orchestrator.recall.ranker import RankReport
from orchestrator.recall.render import one_line
from orchestrator.recall.tail import Candidate, Dropped, Precedence


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
    section: str = ""  # the innermost heading a chunk stands under ("" for none)

    @property
    def named(self) -> str:
        """The label with the chunk's section after its title, for the text trace: "Recall ›
        The lexical lane #01a2...", not forty lines of "Recall #..." (stop 50)."""
        title, mark, rest = self.label.rpartition(" #")
        return f"{title} › {self.section}{mark}{rest}" if self.section and mark else self.label


def item(c: Candidate) -> TraceItem:
    if c.source is not None:
        label = f"{one_line(c.source.title)} #{c.chunk_id}"  # a title cannot break a line
    elif c.item_id is not None:
        snippet = " ".join(c.text.split())
        # The id's last eight digits: its first eight are a UUIDv7's clock, the same for
        # every row written in the same minute ("fact 01a24fbe", "profile 01a24fbe", ...).
        label = (f"{c.kind} {str(c.item_id)[-8:]}: {snippet[:48]}"
                 f"{'...' if len(snippet) > 48 else ''}")
    else:
        label = c.kind
    section = c.source.section[-1][1] if c.source is not None and c.source.section else ""
    return TraceItem(c.key, c.kind, label, c.direct, c.pinned, dict(c.lanes), c.rrf, c.rerank,
                     c.merit, one_line(section))


@dataclass
class Trace:
    question: str
    asker: str | None
    plan: str
    mode: str | None
    budget_tokens: int
    session: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    corpus: dict[str, Any] = field(default_factory=dict)
    pools: dict[str, list[TraceItem]] = field(default_factory=dict)
    fused: list[TraceItem] = field(default_factory=list)
    hydration_dropped: list[Dropped] = field(default_factory=list)
    reranker: str = ""
    ranker: str = ""
    ppr: str = ""
    ranking: RankReport = field(default_factory=RankReport)
    redundant: list[tuple[str, str, bool]] = field(default_factory=list)
    direct_lost: int = 0  # chunks of a named document past its best few: they compete on merit
    # Titles the question names inside a longer phrase another title holds: (title, phrase,
    # the other title); their documents are no direct subjects (``tail.narrower_subjects``).
    narrower: list[tuple[str, str, str]] = field(default_factory=list)
    catalogs: list[str] = field(default_factory=list)  # catalogs the question asks for
    # One-word titles the question names whose pages neither content lane found: no direct
    # subjects (``tail.unfound_subjects``).
    unfound: list[str] = field(default_factory=list)
    diversity: str = ""
    navigation: str = ""  # chunks that are a table of contents or a link list, discounted
    deprecated: str = ""  # chunks with a deprecation notice, discounted
    named_day: str = ""  # items that happened on a day the question names, boosted
    ordered: list[TraceItem] = field(default_factory=list)
    suppressed: list[tuple[str, str, float]] = field(default_factory=list)
    kept: int = 0
    used_tokens: int = 0
    needed_tokens: int | None = None  # nothing fit: the budget that serves the first item
    clipped: tuple[int, int] | None = None  # the last item's part: (its chars, the item's)
    statements: int = 0
    precedence: Precedence = field(default_factory=Precedence)
    side_effect_statements: int = 0
    touched_claims: int = 0
    receipt_id: uuid.UUID | None = None
    model_id: uuid.UUID | None = None  # the tenant's stored model that ranked, if one did
    replay: tuple[Any, Any, list[Candidate]] | None = None  # evaluation: see Recaller.replay
    usage_rows: int = 0  # queued for the background writer: the event and its served rows
    embedding_cached: bool = False
    plan_note: str = ""
    # The registered model and activation the question was embedded with (name@generation).
    embedding_model: str = ""

    def said(self) -> dict[str, str | None]:
        """What each step beyond the pools, fusion, order and budget did: a step's field name
        to its sentence, None when it had nothing to do this time. ``format`` prints these
        words (all but the ranking report's and the tenant model's, which its ranker line
        says); GraphQL's ``TraceStep.text`` (the console's cards) serves them."""
        report = self.ranking
        timings = ", ".join(f"{k} {v:.1f} ms" for k, v in (report.timings_ms or {}).items())
        return {
            "plan_note": self.plan_note or None,
            "embedding_cached": ("from the cache (this tenant, this model)"
                                 if self.embedding_cached else "computed"),
            "narrower": ("titles the question names inside a longer phrase another found title "
                         "holds (no direct subjects): " + ", ".join(
                             f"{title!r} ({phrase!r}, of {other!r})"
                             for title, phrase, other in self.narrower)
                         if self.narrower else None),
            "catalogs": ("catalogs the question asks for by name (direct subjects): "
                         + ", ".join(k.replace("_", " ") for k in self.catalogs)
                         if self.catalogs else None),
            "unfound": ("one-word titles the question names whose pages neither the dense nor "
                        "the lexical lane found (no direct subjects): "
                        + ", ".join(repr(title) for title in self.unfound)
                        if self.unfound else None),
            "ranker": self.ranker or None,
            "ppr": self.ppr or None,
            "ranking": (f"ordered by {report.model or 'the fused score (no learned model)'}"
                        + (f"; {timings}" if timings else "")
                        if report.model or timings else None),
            "model_id": (f"the tenant's own ranking model {self.model_id}"
                         if self.model_id else None),
            "direct_lost": ("their best chunks, a link list only where nothing else of them was "
                            f"found; {self.direct_lost} more of their chunks compete on merit"
                            if self.direct_lost else None),
            "diversity": self.diversity or None,
            "named_day": self.named_day or None,
            "navigation": self.navigation or None,
            "deprecated": self.deprecated or None,
            "redundant": "\n".join(self._redundant()) or None,
            "clipped": (f"the last is a part of its chunk, {self.clipped[0]} of "
                        f"{self.clipped[1]} characters, cut to fit the room left"
                        if self.clipped else None),
            "needed_tokens": (f"nothing fits: the first needs a budget of at least "
                              f"{self.needed_tokens} tokens" if self.needed_tokens else None),
            "usage_rows": (f"{self.usage_rows} usage row(s) queued (written in the background)"
                           if self.usage_rows else None),
        }

    def format(self) -> str:
        said = self.said()
        lines = [f"recall trace: {self.question!r}" + (f" asked by {self.asker}" if self.asker
                                                        else ""),
                 f"plan {self.plan}; mode {self.mode or 'none'}; budget {self.budget_tokens} "
                 f"tokens; {self.statements} statement(s) after binding the identity"
                 + (f"; working memory of session {self.session!r}" if self.session else "")]
        lines.append(f"query embedding: {said['embedding_cached']}"
                     + (f"; {self.plan_note}" if self.plan_note else ""))
        if self.embedding_model:
            lines.append(f"question embedded by {self.embedding_model} (the active model, "
                         "checked in the statement's snapshot)")
        if "chunks" in self.corpus:
            avg = self.corpus.get("avg_length")
            lines.append(f"lexical corpus (visible): {self.corpus.get('chunks')} chunks, average "
                         f"length {'-' if avg is None else f'{float(avg):.1f}'} tokens")
        if self.corpus.get("terms"):
            terms = sorted(self.corpus["terms"], key=lambda t: (t[1], t[0]))
            lines.append("lexical terms as stemmed, rarest first (term chunks holding it: "
                         "chunks scored): " + ", ".join(
                f"{lexeme} {df}: {'all' if took == df else took}" for lexeme, df, took in terms))
        if self.corpus.get("common_titles"):
            lines.append("titles the question names that most other visible chunks hold (they "
                         "name no document; `recall_title_common_share`): " + ", ".join(
                             f"{title!r} (its rarest word in {df} of the {others} chunks "
                             "outside it)"
                             for title, df, others in sorted(self.corpus["common_titles"])))
        lines.extend(line for line in (said["narrower"], said["catalogs"], said["unfound"])
                     if line)
        if self.corpus.get("seeds") is not None:
            # Two entities may share a name (spaCy typed "Installs" a place and an
            # organisation): one name, with how many entities carry it.
            named = Counter(self.corpus["seeds"])
            lines.append("entity seeds: " + (", ".join(
                name if n == 1 else f"{name} ({n} entities)" for name, n in named.items())
                or "none"))
        lines.append("1. candidate pools")
        for lane, items in self.pools.items():
            lines.append(f"   {lane}: {len(items)}")
            for it in items:
                score = {"dense": "dense_distance", "lexical": "bm25"}.get(lane, f"{lane}_distance")
                rank = {"dense": "dense_rank", "lexical": "lexical_rank",
                        "title": "title_rank"}.get(lane, f"{lane}_rank")
                parts = []
                if rank in it.lanes:
                    parts.append(f"rank {it.lanes.get(rank)}")
                if score in it.lanes:
                    parts.append(f"{score} {self._num(it.lanes.get(score))}")
                if lane == "title":
                    parts.append("direct subject" if it.direct else "contained in a longer title")
                lines.append(f"     {it.named}: " + ", ".join(parts))
        lines.append(f"2. fusion (RRF) and hydration: {len(self.fused)} candidates, "
                     f"{len(self.hydration_dropped)} dropped at hydration")
        for d in self.hydration_dropped:
            ranks = ", ".join(f"{k} {v}" for k, v in d.lanes.items() if k.endswith("_rank"))
            lines.append(f"     dropped {d.label}: document {d.reason} ({ranks or 'no rank'}, "
                         f"rrf {self._num(d.rrf)})")
        for it in self.fused:
            lines.append(f"     {it.named}: rrf {self._num(it.rrf)}" +
                         (" [direct]" if it.direct else "") + (" [pinned]" if it.pinned else ""))
        lines.append(f"3. reranker: {self.reranker}")
        lines.append(f"   learned ranker: {self.ranker}")
        lines.append(f"   personalized PageRank: {self.ppr}")
        p = self.precedence
        for c, winner in p.beaten_claims:
            lines.append(f"     dropped {item(c).label}: outranked by keyed fact {winner}")
        for c in p.below_gate:
            lines.append(f"     dropped {item(c).label}: confidence {c.confidence} below the gate")
        for c, w in p.contradicted:
            lines.append(f"     demoted {item(c).label}: contradicted by "
                         f"{item(w).label if w is not None else c.contradicted_by}")
        lost = f" ({said['direct_lost']})" if said["direct_lost"] else ""
        navigation = "".join(f"; {note}" for note in (self.named_day, self.navigation,
                                                      self.deprecated) if note)
        lines.append(f"4. order (direct subjects first{lost}, then merit; diversity: "
                     f"{self.diversity or 'not run'}{navigation})")
        for n, it in enumerate(self.ordered, 1):
            rr = "" if it.rerank is None else f", rerank {self._num(it.rerank)}"
            lines.append(f"     {n}. {it.named}: merit {self._num(it.merit)}{rr}" +
                         (" [direct]" if it.direct else ""))
        for dropped, twin, sim in self.suppressed:
            lines.append(f"     suppressed {near_duplicate(dropped, twin, sim)}")
        lines.extend(f"     {dropped}" for dropped in self._redundant())
        lines.append(f"5. budget: kept the first {self.kept} of {len(self.ordered)}, "
                     f"{self.used_tokens} of {self.budget_tokens} tokens"
                     + "".join(f"; {said[k]}" for k in ("clipped", "needed_tokens") if said[k]))
        lines.append(f"6. side effects: {self.touched_claims} fact access counter(s) to bump "
                     "(in the background); "
                     + (f"receipt {self.receipt_id}" if self.receipt_id else "no receipt")
                     + (f"; {said['usage_rows']}" if said["usage_rows"] else "")
                     + f" ({self.side_effect_statements} statement(s))")
        lines.append("timings: " + ", ".join(f"{k} {v:.1f} ms" for k, v in self.timings_ms.items()))
        return "\n".join(lines)

    def _redundant(self) -> list[str]:
        return [f"dropped {key}: its text is in {holder}, "
                + ("which takes its place" if raised else "ranked above it")
                for key, holder, raised in self.redundant]

    @staticmethod
    def _num(v: Any) -> str:
        return "-" if v is None else f"{float(v):.6f}"


def report(trace: Trace, rendered: str) -> str:
    """Every stage of ``trace``, then the rendered string (``messages.shown``)."""
    return shown(trace.format(), rendered, nothing_served(trace.needed_tokens, trace.budget_tokens))
