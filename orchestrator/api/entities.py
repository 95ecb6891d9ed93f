"""Entity reads shared by the GraphQL resolvers, the Python client and MCP.

Entities are typed names with aliases (``knowledge.entities``); resolution and
merging live in ``orchestrator.ingest.knowledge`` and the database. A listing
shows canonical entities only (a merged-away entity still answers by id, with
``merged_into`` naming its survivor), ordered by type, normalised name and id.
A search ``query`` is normalised as resolution normalises names (the SQL
function ``knowledge.normalize_name``) and matches inside the name or any alias.

A listing also leaves out an entity extraction made that nothing current names any longer
(``retracted``): every claim about it the caller can read is the extractor's and retracted,
and no note gives it an alias. Extraction's rules change (stop 50: a Portuguese page read by
the English model made "Detectadas" and "Três" organisations), and a re-read retracts what
the current rules no longer say, but the entity row stays (history, lineage, old receipts):
the console's Entities page listed such names for good. ``retracted=True`` lists them too;
by id, every entity still answers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, and_, exists, func, or_, select
from sqlalchemy.orm import Session

from orchestrator.api.documents import (
    Page,
    ScopeView,
    encode_cursor,
    keyset_page,
    scope_views,
    scopes_of,
)
from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.knowledge_models import Entity, FactClaim
from orchestrator.errors import BadInput, NotFound
from orchestrator.ingest.knowledge import visible_ids


@dataclass(frozen=True)
class EntityView:
    id: uuid.UUID
    type: str
    name: str
    aliases: list[str]
    summary: str | None
    scopes: list[ScopeView]
    merged_into: uuid.UUID | None
    created_by: str | None
    created_at: datetime
    updated_at: datetime


EntityPage = Page[EntityView]


def _views(session: Session, identity: Identity, rows: list[Entity]) -> list[EntityView]:
    if not rows:
        return []
    scopes = scope_views(session, identity)
    # A survivor the caller cannot read is not named (its id is a hidden row's).
    survivors = visible_ids(session, Entity, [e.merged_into for e in rows])
    return [EntityView(e.id, e.entity_type, e.canonical_name, list(e.aliases), e.summary,
                       scopes_of(scopes, e.scopes),
                       e.merged_into if e.merged_into in survivors else None, e.created_by,
                       e.created_at, e.updated_at) for e in rows]


def _only_retracted() -> ColumnElement[bool]:
    """Whether an entity is extraction's alone and nothing current names it: claims about it
    the caller can read exist, every one of them the extractor's and retracted, and no note
    gives it an alias (``extract._extractor_only``, whose reading of "the extractor's" this
    shares)."""
    about = and_(FactClaim.tenant_id == Entity.tenant_id,
                 or_(FactClaim.subject_id == Entity.id, FactClaim.object_id == Entity.id))
    return and_(Entity.given_aliases == {},
                exists().where(about),
                ~exists().where(about, or_(FactClaim.superseded_at.is_(None),
                                           FactClaim.author_role.is_distinct_from("extractor"))))


def list_entities(session: Session, identity: Identity, settings: Settings, *,
                  query: str | None = None, entity_type: str | None = None, first: int = 20,
                  after: str | None = None, retracted: bool = False) -> EntityPage:
    stmt = select(Entity).where(Entity.merged_into.is_(None))
    if not retracted:
        stmt = stmt.where(~_only_retracted())
    if entity_type is not None:
        stmt = stmt.where(Entity.entity_type == entity_type)
    if query is not None:
        key = session.execute(select(func.knowledge.normalize_name(query))).scalar()
        if key is None:
            raise BadInput(f"the entity query {query!r} must contain a letter or digit")
        # Normalised keys never hold '|', so a match cannot span two aliases.
        stmt = stmt.where(or_(Entity.name_key.contains(key, autoescape=True),
                              func.array_to_string(Entity.alias_keys, "|").contains(key, autoescape=True)))
    rows, more, before = keyset_page(session, stmt, (Entity.entity_type, Entity.name_key, Entity.id),
                                     first=first, after=after, max_page=settings.api_max_page_size)
    keys = {e.id: e.name_key for e in rows}
    return Page([(encode_cursor(v.type, keys[v.id], str(v.id)), v)
                 for v in _views(session, identity, rows)], more, before)


def entity_by_id(session: Session, identity: Identity, entity_id: uuid.UUID) -> EntityView:
    """The entity with this id; ``NotFound`` when the caller cannot read one."""
    row = session.execute(select(Entity).where(Entity.id == entity_id)).scalar_one_or_none()
    if row is None:
        raise NotFound(f"no entity {entity_id} that you can read")
    return _views(session, identity, [row])[0]
