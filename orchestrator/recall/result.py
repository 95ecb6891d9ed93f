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


class Provenance(StrEnum):
    SOURCE_EXCERPT = "source excerpt"
    DERIVED_MEMORY = "derived memory"
    RECENT_SESSION_MEMORY = "recent session memory"


@dataclass(frozen=True)
class ScopeRef:
    name: str
    description: str


@dataclass(frozen=True)
class SourceRef:
    collection: str
    path: str
    title: str


@dataclass(frozen=True)
class Evidence:
    text: str
    provenance: Provenance
    scopes: tuple[ScopeRef, ...]
    source: SourceRef | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    author: str | None = None
    # Stable handles for APIs and feedback (not rendered into the prompt).
    document_id: uuid.UUID | None = None
    chunk_id: uuid.UUID | None = None
    char_start: int | None = None
    char_end: int | None = None


@dataclass(frozen=True)
class RecallResult:
    question: str
    asker: str | None
    budget_tokens: int
    used_tokens: int
    evidence: tuple[Evidence, ...] = field(default_factory=tuple)
    rendered: str = ""
