"""The aliases a note's front matter gives an entity, kept per note (migration 0087).

A note titled "Priya Raman" with ``aliases: [Priya, PR]`` gives the entity its title names
those aliases (extraction, ``derive.extract``). ``knowledge.entities.given_aliases`` keeps,
per document, which of the entity's aliases that document gave, so that when the note is
read again (its front matter or text changed), renamed to name another entity, opts out of
extraction or is deleted, an alias no document gives any longer leaves the entity's
``aliases`` (and with them its ``alias_keys``: resolution and the question's entity seeds
stop matching it).

A document owns only the aliases it added, or that another document gave already: an alias
the entity had without any document (given by hand, a first name read from the text, one
taken before 0087 that the migration could not match to its note) is the entity's own and
no document removes it. Everything runs under the
caller's RLS: an entity the caller may not write is not touched (its aliases stay).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.db.session import translate

# The most aliases an entity may hold (ck_entities_aliases_count).
MAX_ALIASES = 200


@dataclass(frozen=True)
class GivenAliases:
    """What one document gives now: ``entity_id`` is the entity its title names (None when
    it names none any longer, opts out, or the document goes), ``aliases`` its front matter
    aliases as written, ``scopes`` its scope set (an entity shared wider than the document
    gets no alias from it: readers of its other scopes would see what the note calls it)."""

    document_id: uuid.UUID
    entity_id: uuid.UUID | None = None
    aliases: tuple[str, ...] = ()
    scopes: tuple[uuid.UUID, ...] = ()


def give_document_aliases(session: Session, given: Sequence[GivenAliases]) -> int:
    """Each document's entry replaced by what it gives now; aliases no document gives any
    longer removed from the entity (only those documents added). One locked read of the
    entities concerned (those named and those the documents gave aliases before), one
    update per changed entity. Returns how many aliases were removed."""
    removed = 0
    if not given:
        return removed
    docs = sorted({str(g.document_id) for g in given})
    ids = sorted({g.entity_id for g in given if g.entity_id is not None}, key=str)
    try:
        with session.begin_nested():
            rows = session.execute(text(
                "select id, name_key, scopes, aliases, given_aliases from knowledge.entities "
                "where tenant_id = auth.tenant_id() and (id = any(cast(:ids as uuid[])) "
                "or given_aliases ?| cast(:docs as text[])) order by id for no key update"),
                {"ids": ids, "docs": docs}).all()
            if not rows:
                return removed
            names = sorted({a for g in given for a in g.aliases}
                           | {a for r in rows for a in r.aliases}
                           | {a for r in rows for v in _entries(r.given_aliases).values() for a in v})
            keys: dict[str, str | None] = dict(session.execute(text(
                "select n, knowledge.normalize_name(n) from unnest(cast(:n as text[])) n"),
                {"n": names}).all()) if names else {}
            updates = []
            for row in rows:
                aliases, given_map = _apply(row, given, keys)
                removed += len(row.aliases) - len(set(row.aliases) & set(aliases))
                if aliases != list(row.aliases) or given_map != _entries(row.given_aliases):
                    updates.append({"id": row.id, "a": aliases, "g": json.dumps(given_map)})
            if updates:
                session.execute(text(
                    "update knowledge.entities set aliases = cast(:a as text[]), "
                    "given_aliases = cast(:g as jsonb) "
                    "where tenant_id = auth.tenant_id() and id = :id"), updates)
    except DBAPIError as exc:
        raise translate(exc) from exc
    return removed


def _entries(value: object) -> dict[str, list[str]]:
    """``given_aliases`` as document id -> aliases, anything else in it (a value that is no
    list, an alias that is no string: only this module writes it) left out."""
    if not isinstance(value, dict):
        return {}
    return {str(d): [a for a in v if isinstance(a, str)] for d, v in value.items()
            if isinstance(v, list)}


def _apply(row: Any, given: Sequence[GivenAliases], keys: dict[str, str | None]
           ) -> tuple[list[str], dict[str, list[str]]]:
    """One entity's aliases and given aliases after ``given``."""
    entity_id, name_key, scopes = row.id, row.name_key, set(row.scopes)
    aliases = list(row.aliases)
    given_map = _entries(row.given_aliases)
    present = {keys.get(a) for a in aliases} - {None}
    dropped: set[str] = set()

    def owned(v: list[str]) -> set[str]:
        return {k for a in v if (k := keys.get(a)) is not None}

    for g in given:
        doc = str(g.document_id)
        before = owned(given_map.pop(doc, []))
        if g.entity_id != entity_id or not scopes <= set(g.scopes):
            dropped |= before
            continue
        elsewhere = set().union(*(owned(v) for v in given_map.values()))
        now: list[str] = []
        taken: set[str] = set()
        for alias in g.aliases:
            key = keys.get(alias)
            if key is None or key == name_key or key in taken:
                continue
            if key not in present:  # the document adds it (within the cap)
                if len(aliases) >= MAX_ALIASES:
                    continue
                aliases.append(alias)
                present.add(key)
            elif key not in before and key not in elsewhere:
                continue  # the entity's own alias (by hand, a first name, before 0087)
            now.append(alias)
            taken.add(key)
        dropped |= before - taken
        if now:
            given_map[doc] = now
    gone = dropped - set().union(*(owned(v) for v in given_map.values()))
    if gone:
        aliases = [a for a in aliases if keys.get(a) not in gone]
    return aliases, given_map
