"""Writing derived memory from the dialogue: decisions, causal links, episodes, working memory.

The builders that distil memory in the background come later; these are the
direct writes an agent makes during a session. As in ``ingest.knowledge``, the
database enforces scopes and ownership (a working-memory item always belongs to
the bound user); this module checks what Python can see first and runs each
write in a savepoint so a refusal leaves nothing behind.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from orchestrator.db.knowledge_models import Decision, DecisionLink, Episode, WorkingMemoryItem
from orchestrator.errors import BadInput
from orchestrator.ingest.documents import resolve_scopes
from orchestrator.ingest.knowledge import require_visible, savepoint
from orchestrator.inputs import one_of

CausalKind = Literal["caused", "influenced", "precedent_for"]
CAUSAL_KINDS = ("caused", "influenced", "precedent_for")
ItemKind = Literal["note", "decision"]
ITEM_KINDS = ("note", "decision")


@dataclass(frozen=True)
class DecisionInput:
    category: str
    scenario: str
    reasoning: str
    confidence: float
    scopes: tuple[str, ...]
    outcome: str | None = None


def _text(name: str, value: object, limit: int = 20000) -> None:
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"{name} must not be empty")
    if len(value) > limit:
        raise BadInput(f"{name} is {len(value)} characters; the limit is {limit}")


def _unit(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise BadInput(f"{name} {value!r} is outside [0, 1]")
    return float(value)


def _aware(name: str, value: datetime) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise BadInput(f"{name} must be a datetime with a time zone")
    return value


def record_decision(session: Session, decision: DecisionInput) -> uuid.UUID:
    _text("category", decision.category, 100)
    _text("scenario", decision.scenario)
    _text("reasoning", decision.reasoning)
    confidence = _unit("confidence", decision.confidence)
    scope_ids = resolve_scopes(session, decision.scopes)
    with savepoint(session):
        new_id: uuid.UUID = session.execute(insert(Decision).values(
            category=decision.category, scenario=decision.scenario, reasoning=decision.reasoning,
            outcome=decision.outcome, confidence=confidence, scopes=scope_ids,
        ).returning(Decision.id)).scalar_one()
        return new_id


def link_decisions(session: Session, source: uuid.UUID, target: uuid.UUID, kind: CausalKind,
                   scopes: Sequence[str]) -> uuid.UUID:
    """``source`` caused / influenced / is a precedent for ``target``."""
    one_of(kind, CAUSAL_KINDS, "kind")
    if source == target:
        raise BadInput("a decision cannot be linked to itself")
    require_visible(session, Decision, [source, target], "decision")
    scope_ids = resolve_scopes(session, tuple(scopes))
    with savepoint(session):
        new_id: uuid.UUID = session.execute(insert(DecisionLink).values(
            from_decision_id=source, to_decision_id=target, kind=kind, scopes=scope_ids,
        ).returning(DecisionLink.id)).scalar_one()
        return new_id


def record_episode(session: Session, session_id: str, summary: str, started_at: datetime,
                   ended_at: datetime, scopes: Sequence[str], *, turn_count: int = 0
                   ) -> uuid.UUID:
    """A bounded dialogue summary; its embedding is queued."""
    _text("session_id", session_id, 200)
    _text("summary", summary)
    if _aware("ended_at", ended_at) < _aware("started_at", started_at):
        raise BadInput("an episode cannot end before it starts")
    if isinstance(turn_count, bool) or not isinstance(turn_count, int) or turn_count < 0:
        raise BadInput("turn_count must be a non-negative integer")
    scope_ids = resolve_scopes(session, tuple(scopes))
    with savepoint(session):
        new_id: uuid.UUID = session.execute(insert(Episode).values(
            session_id=session_id, summary=summary, started_at=started_at, ended_at=ended_at,
            turn_count=turn_count, scopes=scope_ids,
        ).returning(Episode.id)).scalar_one()
        return new_id


# Working memory is recent memory: a note outlives its session by at most a year.
MAX_TTL_SECONDS = 366 * 86_400


def ttl_seconds(seconds: object) -> timedelta:
    """A note's time to live from a count of seconds (GraphQL ``ttlSeconds``, MCP, client)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise BadInput(f"ttl_seconds must be a whole number of seconds, not {seconds!r}")
    if seconds <= 0:
        raise BadInput("ttl must be a positive duration")
    if seconds > MAX_TTL_SECONDS:
        raise BadInput(f"ttl_seconds {seconds} is above the limit of {MAX_TTL_SECONDS} (a year)")
    return timedelta(seconds=seconds)


def add_working_memory(session: Session, session_id: str, text: str, scopes: Sequence[str], *,
                       ttl: timedelta = timedelta(days=1), kind: ItemKind = "note",
                       category: str | None = None) -> uuid.UUID:
    """A recent session item of the bound user, recallable until ``ttl`` has passed.

    ``kind="decision"`` marks it as a decision: the decision hook
    (``orchestrator.derive.decisions``) records it in ``memory.decisions`` under
    ``category`` (default ``general``), shared into the item's scopes.
    """
    _text("session_id", session_id, 200)
    _text("text", text)
    if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
        raise BadInput("ttl must be a positive duration")
    one_of(kind, ITEM_KINDS, "kind")
    if category is not None:
        if kind != "decision":
            raise BadInput("only an item marked as a decision has a category")
        _text("category", category, 100)
    scope_ids = resolve_scopes(session, tuple(scopes))
    with savepoint(session):
        new_id: uuid.UUID = session.execute(insert(WorkingMemoryItem).values(
            session_id=session_id, text=text, scopes=scope_ids,
            expires_at=func.now() + ttl, kind=kind, category=category,
        ).returning(WorkingMemoryItem.id)).scalar_one()
        return new_id


def working_memory(session: Session, session_id: str | None = None, *, limit: int | None = None
                   ) -> list[str]:
    """The bound user's unexpired items, oldest first; at most ``limit``."""
    stmt = select(WorkingMemoryItem.text).where(WorkingMemoryItem.expires_at > func.now())
    if session_id is not None:
        stmt = stmt.where(WorkingMemoryItem.session_id == session_id)
    return list(session.execute(stmt.order_by(WorkingMemoryItem.created_at).limit(limit)).scalars())
