"""A random world with secrets: tenants, scope sets, documents, entities, claims, memory and
everything the derive jobs make of them, built through the real API and the real jobs, and a
model of who may read which row.

Every source row carries words that occur nowhere else (``Secrets``): ``zq`` plus letters, and
person names made of such words. A word is *forbidden* to an identity when every row that holds
it is one the identity cannot read; a derived row that repeats a word it should not have seen is
therefore caught without knowing how it was derived. The rows of every tenant table are read
back as the superuser after the jobs ran (``World.load_rows``), so ids of derived rows are known
too, with the same read rule the policies apply (``Row.readable_by``).

The world is made so that the situations behind issue 16's leaks arise: entities shared into
fewer scopes than the claims that name them (written by someone who reads both), aliases of a
hidden entity mentioned in a document of another scope set, conflicting claims across scope
sets, keyed facts, relations (communities), opinions (perspective profiles), session notes,
decisions and episodes.
"""

from __future__ import annotations

import random
import re
import string
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text

from orchestrator.auth import Identity
from tests.support.api import ApiServer

# Tables a client can reach through some read surface, and how a row of each is read.
OVERLAP_TABLES = ("sources.documents", "sources.chunks", "knowledge.entities", "knowledge.fact_claim",
                  "memory.communities", "memory.raptor_nodes", "memory.profiles",
                  "memory.observations", "memory.decisions", "memory.decision_links")


class Secrets:
    """Unique words from one seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self) -> str:
        while True:
            w = "zq" + "".join(self.rng.choice(string.ascii_lowercase) for _ in range(7))
            if w not in self.used:
                self.used.add(w)
                return w

    def name(self) -> str:
        """A person's name: two secret words, capitalised."""
        return f"{self.word().capitalize()} {self.word().capitalize()}"


SECRET = re.compile(r"zq[a-z]+")


def words_of(*values: str | None) -> frozenset[str]:
    return frozenset(w for v in values if v for w in SECRET.findall(v.lower()))


@dataclass
class Row:
    table: str
    id: str
    org: str
    scopes: frozenset[str]
    words: frozenset[str] = frozenset()
    owner: str | None = None  # private to this user (session notes, private episodes)
    parties: tuple[str, ...] = ()  # rows a reader must also read (a conflict's claims, subject)

    def readable_by(self, ident: Identity, rows: dict[str, Row]) -> bool:
        if ident.org_id != self.org or not (self.scopes & ident.readable):
            return False
        if self.owner is not None and self.owner != ident.user_id:
            return False
        return all(p in rows and rows[p].readable_by(ident, rows) for p in self.parties)


@dataclass
class Tenant:
    org: str
    id: uuid.UUID
    scopes: list[str]
    paths: list[tuple[str, str]] = field(default_factory=list)
    entities: list[tuple[str, str]] = field(default_factory=list)  # (type, name)
    # Each document's input as written (for moving it later), by path.
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class World:
    seed: int
    tenants: list[Tenant]
    rows: dict[str, Row] = field(default_factory=dict)
    # Words written into source rows: (org, scopes, owner) of each row holding the word.
    holders: dict[str, list[Row]] = field(default_factory=lambda: defaultdict(list))
    questions: dict[str, list[str]] = field(default_factory=dict)

    def hold(self, row: Row) -> None:
        self.rows.setdefault(row.id, row)
        for w in row.words:
            self.holders[w].append(row)

    def forbidden_words(self, ident: Identity) -> set[str]:
        return {w for w, rows in self.holders.items()
                if not any(r.readable_by(ident, self.rows) for r in rows)}

    def forbidden_ids(self, ident: Identity, *, own_tenant: bool = True) -> set[str]:
        """Ids of rows ``ident`` cannot read (with ``own_tenant`` false: other tenants' only)."""
        return {r.id for r in self.rows.values()
                if not r.readable_by(ident, self.rows) and (own_tenant or r.org != ident.org_id)}

    def readable(self, ident: Identity, table: str) -> list[Row]:
        return [r for r in self.rows.values() if r.table == table and r.readable_by(ident, self.rows)]

    def tenant(self, org: str) -> Tenant:
        return next(t for t in self.tenants if t.org == org)

    def load_rows(self, admin_engine: Engine) -> None:
        """Every row of the world's tenants as stored now (derived ones included), with its
        read rule; words stay those written into source rows."""
        orgs = {t.id: t.org for t in self.tenants}
        with admin_engine.connect() as conn:
            names: dict[uuid.UUID, str] = dict(conn.execute(text(  # type: ignore[arg-type]
                "select id, name from auth.scopes where tenant_id = any(:t)"), {"t": list(orgs)}).all())

            def scopes(ids: Iterable[uuid.UUID]) -> frozenset[str]:
                return frozenset(names[i] for i in ids)

            found: list[Row] = []
            for table in OVERLAP_TABLES:
                for tid, rid, sc in conn.execute(text(
                        f"select tenant_id, id, scopes from {table} where tenant_id = any(:t)"),
                        {"t": list(orgs)}):
                    found.append(Row(table, str(rid), orgs[tid], scopes(sc)))
            for tid, rid, sc, user in conn.execute(text(
                    "select tenant_id, id, scopes, user_id from memory.working_memory "
                    "where tenant_id = any(:t)"), {"t": list(orgs)}):
                found.append(Row("memory.working_memory", str(rid), orgs[tid], scopes(sc), owner=user))
            for tid, rid, sc, user, private in conn.execute(text(
                    "select tenant_id, id, scopes, user_id, private from memory.episodes "
                    "where tenant_id = any(:t)"), {"t": list(orgs)}):
                found.append(Row("memory.episodes", str(rid), orgs[tid], scopes(sc),
                                 owner=user if private else None))
            for tid, rid, sc, a, b, subject in conn.execute(text(
                    "select tenant_id, id, scopes, claim_a, claim_b, subject_id from knowledge.conflicts "
                    "where tenant_id = any(:t)"), {"t": list(orgs)}):
                found.append(Row("knowledge.conflicts", str(rid), orgs[tid], scopes(sc),
                                 parties=(str(a), str(b), str(subject))))
        # A row of these tables that is gone (a deleted document's chunks, a withdrawn
        # summary) is gone from the model too; a moved row holds its words in its new scopes.
        reloaded = {*OVERLAP_TABLES, "memory.working_memory", "memory.episodes",
                    "knowledge.conflicts"}
        rows = {i: r for i, r in self.rows.items() if r.table not in reloaded}
        for row in found:
            known = self.rows.get(row.id)
            rows[row.id] = Row(row.table, row.id, row.org, row.scopes,
                               known.words if known else frozenset(), row.owner, row.parties)
        self.rows = rows
        for w, holders in list(self.holders.items()):
            self.holders[w] = [rows[r.id] for r in holders if r.id in rows]


@dataclass
class Writer:
    """A token and what it may do, for building the world through the API."""

    server: ApiServer
    org: str
    user: str
    read: tuple[str, ...]
    write: tuple[str, ...]

    @property
    def token(self) -> str:
        return self.server.token(self.org, self.user, tuple(f"read:{s}" for s in self.read)
                                 + tuple(f"write:{s}" for s in self.write))

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.server.gql(self.token, query, variables)


def subset(rng: random.Random, items: list[str], low: int = 1, high: int | None = None) -> list[str]:
    high = len(items) if high is None else min(high, len(items))
    return sorted(rng.sample(items, rng.randint(low, high))) if high >= low else []
