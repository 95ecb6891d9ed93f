"""``memory_prepare``: one bundle for a prompt, under one token budget.

The bundle is cut from the same ordered candidates recall uses (one statement,
the same tail), grouped into sections:

* **Current keyed facts** about the entities in play (the question's entity
  seeds, and the keyed facts that beat prose among the candidates);
* **Relevant evidence**: everything else, in recall's order;
* **Lessons**: decisions that have an outcome;
* **Recent episodes**: bounded dialogue summaries, newest first;
* **Top documents**: the documents the best source excerpts come from.

Under a tight budget every section should still be represented, so the items
are taken round-robin (per round: one keyed fact, two evidence items, one lesson,
one episode, one document) and the longest prefix of that sequence whose
rendering fits the budget is kept. The rendering groups the kept items by
section; an item never appears in two sections.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from itertools import zip_longest
from typing import Any

from jinja2 import Template

from orchestrator.recall.excerpt import fit, least_budget
from orchestrator.recall.render import environment
from orchestrator.recall.result import Evidence, ScopeRef, served_rows
from orchestrator.recall.tail import Candidate, token_cost, trim_overlaps
from orchestrator.recall.trace import Trace

KEYED, EVIDENCE, LESSONS, EPISODES, DOCUMENTS = range(5)
HEADINGS = ("Current keyed facts", "Relevant evidence", "Lessons (decisions with outcomes)",
            "Recent episodes", "Top documents")
# At most this many items of a section; evidence is bounded by the budget alone.
CAPS = {KEYED: 8, LESSONS: 3, EPISODES: 3, DOCUMENTS: 5}
# Items a section contributes per round of the round-robin.
PER_ROUND = {KEYED: 1, EVIDENCE: 2, LESSONS: 1, EPISODES: 1, DOCUMENTS: 1}
NEVER = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class DocumentRef:
    title: str
    collection: str
    path: str
    document_id: uuid.UUID
    scopes: tuple[ScopeRef, ...]
    occurred_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True)
class PreparedMemory:
    question: str
    asker: str | None
    budget_tokens: int
    used_tokens: int
    keyed_facts: tuple[Evidence, ...] = field(default_factory=tuple)
    evidence: tuple[Evidence, ...] = field(default_factory=tuple)
    lessons: tuple[Evidence, ...] = field(default_factory=tuple)
    episodes: tuple[Evidence, ...] = field(default_factory=tuple)
    documents: tuple[DocumentRef, ...] = field(default_factory=tuple)
    rendered: str = ""
    # As ``RecallResult.needed_tokens``: nothing fit, the budget that serves the first item.
    needed_tokens: int | None = None
    # As ``RecallResult.receipt_id``.
    receipt_id: uuid.UUID | None = None

    def served_rows(self) -> list[tuple[str, uuid.UUID]]:
        rows = served_rows(self.keyed_facts + self.evidence + self.lessons + self.episodes)
        return rows + [("sources.documents", d.document_id) for d in self.documents]


@lru_cache(maxsize=1)
def _template() -> Template:
    return environment().get_template("prepare.j2")


def render_bundle(question: str, sections: Sequence[Sequence[Any]]) -> str:
    return _template().render(question=question,
                              sections=[(HEADINGS[i], list(items)) for i, items in enumerate(sections)])


def sections_of(ordered: Sequence[Candidate]) -> list[list[Any]]:
    """The five sections, each in its own order, before the budget."""
    keyed = [c for c in ordered if c.kind == "keyed fact"]
    lessons = [c for c in ordered if c.kind == "decision" and c.outcome]
    episodes = sorted((c for c in ordered if c.kind == "episode"),
                      key=lambda c: c.ended_at or c.occurred_at or NEVER, reverse=True)
    placed = {c.key for c in (*keyed, *lessons, *episodes)}
    evidence = [c for c in ordered if c.key not in placed]
    documents: list[DocumentRef] = []
    seen: set[uuid.UUID] = set()
    for c in ordered:
        if c.source is not None and c.document_id is not None and c.document_id not in seen:
            seen.add(c.document_id)
            documents.append(DocumentRef(c.source.title, c.source.collection, c.source.path,
                                         c.document_id, c.scopes, c.occurred_at, c.updated_at))
    out: list[list[Any]] = [keyed, evidence, lessons, episodes, documents]
    return [items[:CAPS[i]] if i in CAPS else items for i, items in enumerate(out)]


def round_robin(sections: Sequence[Sequence[Any]]) -> list[tuple[int, Any]]:
    """The order items are admitted in: one round takes ``PER_ROUND`` items of each section."""
    chunks = []
    for i, items in enumerate(sections):
        step = PER_ROUND[i]
        chunks.append([[(i, x) for x in items[n:n + step]] for n in range(0, len(items), step)])
    out: list[tuple[int, Any]] = []
    for rnd in zip_longest(*chunks, fillvalue=[]):
        for part in rnd:
            out.extend(part)
    return out


def build_bundle(question: str, asker: str | None, budget_tokens: int,
                 ordered: Sequence[Candidate], trace: Trace, chars_per_token: float
                 ) -> PreparedMemory:
    sections = sections_of(ordered)
    admitted = round_robin(sections)

    def grouped(n: int) -> list[list[Any]]:
        out: list[list[Any]] = [[] for _ in HEADINGS]
        for i, x in admitted[:n]:
            out[i].append(x.evidence() if isinstance(x, Candidate) else x)
        # Neighbouring excerpts of one document print their shared paragraph once.
        out[EVIDENCE] = trim_overlaps(out[EVIDENCE])
        return out

    def cost(n: int) -> tuple[int, str]:
        text = render_bundle(question, grouped(n))
        return token_cost(text, chars_per_token), text

    # A longer prefix never renders shorter: bisect for the longest that fits.
    lo, (lo_cost, lo_text) = 0, cost(0)
    hi = len(admitted)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        c, text = cost(mid)
        if c <= budget_tokens:
            lo, lo_cost, lo_text = mid, c, text
        else:
            hi = mid - 1
    sections = grouped(lo)
    # The next item, evidence from a source, cut to the part that fits the room left, as
    # recall cuts its list (``excerpt.fit``): 300 tokens served an excerpt through recall
    # and nothing through memory_prepare (stop 44).
    nxt = admitted[lo][1] if lo < len(admitted) and admitted[lo][0] == EVIDENCE else None
    whole = nxt.evidence() if isinstance(nxt, Candidate) else None

    def with_part(part: Evidence) -> list[list[Any]]:
        out = [list(items) for items in sections]
        out[EVIDENCE] = trim_overlaps([*sections[EVIDENCE], part])
        return out

    def fitted_at(budget: int) -> tuple[Evidence, str, int] | None:
        if whole is None:
            return None
        return fit(question, whole, budget, chars_per_token, lo_cost,
                   lambda part: render_bundle(question, with_part(part)))

    fitted = fitted_at(budget_tokens)
    if fitted is not None and whole is not None:
        part, lo_text, lo_cost = fitted
        trace.clipped = (len(part.text), len(whole.text))
        sections = with_part(part)
        lo += 1
    elif not lo and admitted:
        # Something matched and nothing fits: the budget that serves the first item.
        first = cost(1)[0]
        trace.needed_tokens = least_budget(
            lambda budget: first <= budget or fitted_at(budget) is not None, budget_tokens, first)
    trace.kept, trace.used_tokens = lo, lo_cost
    keyed, evidence, lessons, episodes, documents = sections
    return PreparedMemory(question, asker, budget_tokens, lo_cost, tuple(keyed), tuple(evidence),
                          tuple(lessons), tuple(episodes), tuple(documents), lo_text,
                          trace.needed_tokens)
