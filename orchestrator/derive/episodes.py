"""Episodes: bounded summaries of working-memory sessions, private to their user.

Working memory is a user's recent session items (``memory.working_memory``,
readable only by that user). This job turns each session into episodes of at
most ``max_items`` items (``ENGRAM_DERIVE_EPISODE_MAX_ITEMS``): an extractive
(or configured) summary of their texts, their time span (the first and last
item's ``created_at``), ``turn_count`` and ``source_item_ids``.

**Private.** An episode is built from one user's items and is written with
``private = true`` and that ``user_id``, so only that user (and the service
that builds it) can read it, whatever its scopes (migration 0011). Items of one
session shared into different scope sets make different episodes, each shared
into its items' set, so an episode never mixes scopes.

**Incremental.** An item already listed by an episode of its user and session
is never summarised again. New items first fill the session's open episode
(the latest one of that scope set, while it has fewer than ``max_items``
items), which is updated in place; the rest start new episodes. A session with
no new items is not touched. Episodes outlive their items: an item edited or
deleted later does not rewrite the episode that summarised it.

Run as the service (``engram worker run``) it builds every user's episodes; run
by a user (``engram derive episodes``) it builds that user's own. Each written
episode is recorded as derived from its items, inside one ``derive.episodes``
activity per run that writes anything.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivation
from orchestrator.config import Settings
from orchestrator.db.knowledge_models import Episode, WorkingMemoryItem
from orchestrator.derive import poison
from orchestrator.derive.digest import Digester
from orchestrator.derive.service import job_lock
from orchestrator.errors import BadInput

MAX_ITEMS = 20
MAX_SENTENCES = 5
MAX_ITEMS_LIMIT = 1000

_Group = tuple[str, str, tuple[uuid.UUID, ...]]  # user, session, scope set


@dataclass
class EpisodesReport:
    inserted: int = 0
    updated: int = 0
    sessions: int = 0
    items: int = 0
    changed_ids: list[uuid.UUID] = field(default_factory=list)


@dataclass(frozen=True)
class _Item:
    id: uuid.UUID
    text: str
    created_at: datetime


@dataclass
class _Stored:
    id: uuid.UUID
    sources: list[uuid.UUID]
    started_at: datetime
    ended_at: datetime


def build(session: Session, *, max_items: int | None = None, max_sentences: int = MAX_SENTENCES,
          settings: Settings | None = None) -> EpisodesReport:
    """Summarise the working-memory items not yet in an episode; touch only sessions that grew."""
    limit = max_items if max_items is not None else (
        settings.derive_episode_max_items if settings is not None else MAX_ITEMS)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_ITEMS_LIMIT:
        raise BadInput(f"max_items must be an integer from 1 to {MAX_ITEMS_LIMIT}, not {limit!r}")
    if isinstance(max_sentences, bool) or not isinstance(max_sentences, int) or max_sentences < 1:
        raise BadInput(f"max_sentences must be a positive integer, not {max_sentences!r}")
    job_lock(session, "episodes")
    uuids = ARRAY(UUID(as_uuid=True))
    w = WorkingMemoryItem
    items: dict[_Group, list[_Item]] = defaultdict(list)
    by_id: dict[uuid.UUID, _Item] = {}
    for row in session.execute(
            select(w.id, w.user_id, w.session_id, w.scopes, w.text, w.created_at)
            .where(w.scopes.contained_by(func.auth.write_scopes(type_=uuids)))
            .order_by(w.created_at, w.id)):
        item = _Item(row.id, row.text, row.created_at)
        items[(row.user_id, row.session_id, tuple(sorted(row.scopes)))].append(item)
        by_id[row.id] = item

    e = Episode
    covered: dict[tuple[str, str], set[uuid.UUID]] = defaultdict(set)
    last: dict[_Group, _Stored] = {}
    for ep in session.execute(
            select(e.id, e.user_id, e.session_id, e.scopes, e.source_item_ids, e.started_at, e.ended_at)
            .where(e.private.is_(True), e.user_id.is_not(None), func.cardinality(e.source_item_ids) > 0)
            .order_by(e.ended_at, e.id)):
        owner = str(ep.user_id)
        covered[(owner, ep.session_id)].update(ep.source_item_ids)
        # Ordered by end: the last one stored for a group is the one that may still be open.
        last[(owner, ep.session_id, tuple(sorted(ep.scopes)))] = _Stored(
            ep.id, list(ep.source_item_ids), ep.started_at, ep.ended_at)

    report = EpisodesReport()
    digest = Digester(settings)
    started_activity = False
    for group in sorted(items):
        user, sess, scopes = group
        new = [it for it in items[group] if it.id not in covered[(user, sess)]]
        if not new:
            continue
        if not started_activity:
            begin_activity(session, "derive.episodes", {"max_items": limit})
            started_activity = True
        report.sessions += 1
        report.items += len(new)
        # A session whose episode the database refuses is skipped alone (poison): no content
        # in the label, only the session's owner and name.
        with poison.item(session, f"working-memory session {sess!r} of {user}", restore=report):
            _write(session, report, last.get(group), new, by_id, sess, scopes, limit, max_sentences,
                   digest)
    if started_activity:
        end_activity(session)
    return report


def _write(session: Session, report: EpisodesReport, open_: _Stored | None, new: list[_Item],
           by_id: dict[uuid.UUID, _Item], sess: str, scopes: tuple[uuid.UUID, ...], limit: int,
           max_sentences: int, digest: Digester) -> None:
    """One session's new items: the open episode grows to ``limit`` items, the rest start new ones."""
    if open_ is not None and len(open_.sources) < limit:
        take, new = new[:limit - len(open_.sources)], new[limit - len(open_.sources):]
        members = [by_id[i] for i in open_.sources if i in by_id] + take
        made = digest([m.text for m in members], max_sentences=max_sentences)
        session.execute(update(Episode).where(Episode.id == open_.id).values(
            summary=made.text or members[-1].text[:2000], summary_method=made.method,
            summary_model=made.model, source_item_ids=open_.sources + [m.id for m in take],
            turn_count=len(open_.sources) + len(take),
            started_at=min([open_.started_at, *(m.created_at for m in take)]),
            ended_at=max([open_.ended_at, *(m.created_at for m in take)])))
        report.updated += 1
        _lineage(session, report, open_.id, [m.id for m in members])
    for at in range(0, len(new), limit):
        members = new[at:at + limit]
        made = digest([m.text for m in members], max_sentences=max_sentences)
        eid = session.execute(insert(Episode).values(
            # user_id and private follow from the items (0011's trigger): their owner's, private.
            session_id=sess, scopes=list(scopes),
            summary=made.text or members[-1].text[:2000], summary_method=made.method,
            summary_model=made.model, source_item_ids=[m.id for m in members],
            turn_count=len(members), started_at=members[0].created_at,
            ended_at=max(m.created_at for m in members)).returning(Episode.id)).scalar_one()
        report.inserted += 1
        _lineage(session, report, eid, [m.id for m in members])


def _lineage(session: Session, report: EpisodesReport, episode: uuid.UUID,
             items: list[uuid.UUID]) -> None:
    report.changed_ids.append(episode)
    record_derivation(session, ("memory.episodes", {"id": str(episode)}),
                      [("memory.working_memory", {"id": str(i)}) for i in items])
