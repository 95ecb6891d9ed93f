"""What recall returns: a typed ``RecallResult`` and the evidence items inside it.

The result carries only what a reader of the prompt may see: text, the public
provenance class, the exact scope objects an item is shared into, where it came
from and when. Lane names and scores live in the trace, never here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Protocol


class Provenance(StrEnum):
    SOURCE_EXCERPT = "source excerpt"
    DERIVED_MEMORY = "derived memory"
    RECENT_SESSION_MEMORY = "recent session memory"


@dataclass(frozen=True)
class ScopeRef:
    name: str
    description: str


# How much of each heading of a section trail an item's header line prints.
SECTION_HEADING_SHOWN = 80


@dataclass(frozen=True)
class SourceRef:
    collection: str
    path: str
    title: str
    # The headings the excerpt stands under, outermost first, as (level, text)
    # (``markdown.section_trails``; the document's title left out): empty under none.
    section: tuple[tuple[int, str], ...] = ()

    @property
    def section_titles(self) -> list[str]:
        return [words for _, words in self.section]

    @property
    def section_line(self) -> str:
        """The trail as a header line prints it: " › " between headings, each cut to
        ``SECTION_HEADING_SHOWN`` characters (a 200-character heading is stored whole)."""
        return " › ".join(w if len(w) <= SECTION_HEADING_SHOWN else w[:SECTION_HEADING_SHOWN - 1] + "…"
                          for w in self.section_titles)


def section_of(stored: Any) -> tuple[tuple[int, str], ...]:
    """``sources.chunks.section`` as stored (a JSON array of {"level", "text"}, or null) as a
    ``SourceRef.section``; anything else is no trail."""
    if not isinstance(stored, list):
        return ()
    return tuple((int(h["level"]), str(h["text"])) for h in stored
                 if isinstance(h, dict) and isinstance(h.get("level"), int) and h.get("text"))


@dataclass(frozen=True)
class FactRef:
    """What a fact says and whose it is: speaker-bound facts keep their author's role,
    epistemic kind and perspective in every hit."""

    subject: str
    predicate: str
    object: str | None
    epistemic_kind: str
    perspective_key: str
    author_role: str
    fact_key: str | None = None
    as_of: datetime | None = None


@dataclass(frozen=True)
class Evidence:
    text: str
    provenance: Provenance
    scopes: tuple[ScopeRef, ...]
    source: SourceRef | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    author: str | None = None
    # What the item is: excerpt, fact, keyed fact, summary, overview, community summary,
    # session note, profile, episode, observation, decision or catalog.
    kind: str = "excerpt"
    fact: FactRef | None = None
    occurred_at: datetime | None = None
    ended_at: datetime | None = None
    # Stable handles for APIs and feedback (not rendered into the prompt).
    document_id: uuid.UUID | None = None
    chunk_id: uuid.UUID | None = None
    char_start: int | None = None
    char_end: int | None = None
    item_table: str | None = None
    item_id: uuid.UUID | None = None
    # Part of the chunk, cut to fit the budget's room (``recall.excerpt``); char_start and
    # char_end locate the part.
    clipped: bool = False


class Served(Protocol):
    """What a recall served, for its receipt and the facts' access counters: a dataclass
    (``RecallResult``, ``PreparedMemory``) whose ``receipt_id`` the recall sets."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def receipt_id(self) -> uuid.UUID | None: ...

    @property
    def question(self) -> str: ...

    @property
    def rendered(self) -> str: ...

    def served_rows(self) -> list[tuple[str, uuid.UUID]]: ...


def served_rows(evidence: tuple[Evidence, ...]) -> list[tuple[str, uuid.UUID]]:
    """``(table, id)`` of every served row, in order, once each."""
    out: list[tuple[str, uuid.UUID]] = []
    for e in evidence:
        if e.item_table is not None and e.item_id is not None and (e.item_table, e.item_id) not in out:
            out.append((e.item_table, e.item_id))
    return out


@dataclass(frozen=True)
class RecallResult:
    question: str
    asker: str | None
    budget_tokens: int
    used_tokens: int
    evidence: tuple[Evidence, ...] = field(default_factory=tuple)
    rendered: str = ""
    # Evidence matched but none fit the budget: the smallest budget that serves the first
    # item (``excerpt.least_budget``); None when something was served or nothing matched.
    needed_tokens: int | None = None
    # The receipt sealed in the recall's transaction (``engram audit receipt``); None when
    # nothing was served or receipts are off.
    receipt_id: uuid.UUID | None = None

    def served_rows(self) -> list[tuple[str, uuid.UUID]]:
        return served_rows(self.evidence)
