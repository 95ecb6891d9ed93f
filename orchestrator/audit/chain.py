"""Verifying the chain, and anchoring its heads outside the database.

``verify`` asks PostgreSQL to recompute every tenant's chain
(``provenance.verify_chain``) and to compare every current memory row with its
latest event (``provenance.verify_rows``). The first check catches edits,
deletions and reorderings of events; the second catches memory rows changed,
inserted or deleted behind the chain's back (a superuser with triggers off).
Both run as the caller: an auditor sees keys and hashes, never row content.

A third check reads who wrote each event (``foreign_writers``): Engram writes
memory only as ``engram_app`` and ``engram_worker`` (``WRITER_ROLES``), so an event
by any other role (a superuser's UPDATE with the triggers on, which the chain
records like any other) is a warning that names the role, its events and their
sequence numbers. A superuser who forges ``actor_role`` by hand passes it.

A superuser could rewrite a whole chain consistently from some event on. Anchors
close that gap *up to the anchor*: ``heads`` are printed (``engram audit anchor``)
and kept somewhere the database cannot reach; ``check_anchors`` later proves that
each anchored event still has the anchored hash, so nothing up to it changed.
Nothing after a tenant's last anchor is vouched for: a superuser who edits a row
and appends a correctly hashed event naming ``engram_app`` after the last anchor
passes every check here, which ``unanchored`` says in so many words (see
docs/provenance.md for what would close that, and what it costs).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.audit.canonical import ChainEvent
from orchestrator.db.session import translate
from orchestrator.errors import BadInput

Executor = Connection | Session


@dataclass(frozen=True)
class ChainBreak:
    seq: int
    problem: str
    expected_hash: bytes | None
    found_hash: bytes | None


@dataclass(frozen=True)
class RowProblem:
    table_name: str
    row_id: dict[str, Any]
    problem: str
    event_seq: int | None
    expected_hash: bytes | None
    found_hash: bytes | None


# The roles Engram writes memory as; events by any other role are reported (not failed):
# BASELINE events are the migrating role's, by design, and are not counted.
WRITER_ROLES = ("engram_app", "engram_worker")


@dataclass(frozen=True)
class ForeignWriter:
    """Events of one tenant written by a role that is not one of Engram's writers."""

    role: str
    operation: str
    events: int
    first_seqs: tuple[int, ...]  # the first few, for a look

    def __str__(self) -> str:
        more = ", ..." if self.events > len(self.first_seqs) else ""
        return (f"{self.events} {self.operation} event(s) written by role {self.role!r}, which is not "
                f"one of Engram's writers ({', '.join(WRITER_ROLES)}): seq "
                f"{', '.join(map(str, self.first_seqs))}{more}")


@dataclass(frozen=True)
class TenantReport:
    tenant_id: uuid.UUID
    checked: int
    head_seq: int | None
    head_hash: bytes | None
    chain_break: ChainBreak | None
    row_problems: list[RowProblem] = field(default_factory=list)
    warnings: list[ForeignWriter] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.chain_break is None and not self.row_problems


def _run(conn: Executor, sql: str, params: dict[str, Any]) -> list[Any]:
    try:
        return list(conn.execute(text(sql), params).all())
    except DBAPIError as exc:
        raise translate(exc) from exc


def verify(conn: Executor, tenant: uuid.UUID | None = None, *, from_seq: int = 1,
           rows: bool = True) -> list[TenantReport]:
    """One report per tenant with events (or the one asked for)."""
    if from_seq < 1:
        raise BadInput(f"--from must be 1 or more, not {from_seq}")
    chains = _run(conn, "select * from provenance.verify_chain(:t, :f)", {"t": tenant, "f": from_seq})
    problems: dict[uuid.UUID, list[RowProblem]] = {}
    if rows:
        for r in _run(conn, "select * from provenance.verify_rows(:t)", {"t": tenant}):
            problems.setdefault(r.tenant_id, []).append(RowProblem(
                r.table_name, r.row_id, r.problem, r.event_seq,
                bytes(r.expected_hash) if r.expected_hash is not None else None,
                bytes(r.found_hash) if r.found_hash is not None else None))
    foreign = foreign_writers(conn, tenant, from_seq=from_seq)
    reports = []
    seen = set()
    for c in chains:
        seen.add(c.tenant_id)
        brk = None if c.ok else ChainBreak(
            c.broken_seq, c.problem,
            bytes(c.expected_hash) if c.expected_hash is not None else None,
            bytes(c.found_hash) if c.found_hash is not None else None)
        reports.append(TenantReport(c.tenant_id, c.checked, c.head_seq,
                                    bytes(c.head_hash) if c.head_hash is not None else None,
                                    brk, problems.get(c.tenant_id, []), foreign.get(c.tenant_id, [])))
    for t, probs in problems.items():
        if t not in seen:  # rows of a tenant that has no events at all
            reports.append(TenantReport(t, 0, None, None, None, probs))
    return reports


def foreign_writers(conn: Executor, tenant: uuid.UUID | None = None, *,
                    from_seq: int = 1) -> dict[uuid.UUID, list[ForeignWriter]]:
    """Per tenant, the events (other than BASELINE) whose ``actor_role`` is not a writer role."""
    rows = _run(conn, """
        select e.tenant_id, e.actor_role, e.operation, count(*) as n,
               (array_agg(e.seq order by e.seq))[1:5] as seqs
          from provenance.events e
         where (cast(:t as uuid) is null or e.tenant_id = :t) and e.seq >= :f
           and e.operation <> 'BASELINE' and e.actor_role <> all(cast(:writers as text[]))
         group by e.tenant_id, e.actor_role, e.operation
         order by e.tenant_id, min(e.seq)""", {"t": tenant, "f": from_seq, "writers": list(WRITER_ROLES)})
    out: dict[uuid.UUID, list[ForeignWriter]] = {}
    for r in rows:
        out.setdefault(r.tenant_id, []).append(
            ForeignWriter(r.actor_role, r.operation, int(r.n), tuple(int(s) for s in r.seqs)))
    return out


@dataclass(frozen=True)
class Head:
    tenant_id: uuid.UUID
    seq: int
    hash: bytes
    recorded_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"tenant_id": str(self.tenant_id), "seq": self.seq, "hash": self.hash.hex(),
                "recorded_at": self.recorded_at.isoformat()}


def heads(conn: Executor, tenant: uuid.UUID | None = None) -> list[Head]:
    rows = _run(conn, """
        select distinct on (e.tenant_id) e.tenant_id, e.seq, e.hash, e.recorded_at
          from provenance.events e where cast(:t as uuid) is null or e.tenant_id = :t
         order by e.tenant_id, e.seq desc""", {"t": tenant})
    return [Head(r.tenant_id, r.seq, bytes(r.hash), r.recorded_at) for r in rows]


@dataclass(frozen=True)
class AnchorCheck:
    tenant_id: uuid.UUID
    seq: int
    ok: bool
    problem: str | None


def parse_anchors(lines: Iterable[str]) -> list[tuple[uuid.UUID, int, bytes]]:
    """Anchors as ``engram audit anchor`` prints them: one JSON object per line."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            out.append((uuid.UUID(obj["tenant_id"]), int(obj["seq"]), bytes.fromhex(obj["hash"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"anchor line {n} is not an anchor ({exc})") from exc
    return out


def check_anchors(conn: Executor, anchors: list[tuple[uuid.UUID, int, bytes]]) -> list[AnchorCheck]:
    out = []
    for tenant, seq, digest in anchors:
        found = conn.execute(text(
            "select hash from provenance.events where tenant_id = :t and seq = :s"),
            {"t": tenant, "s": seq}).scalar()
        if found is None:
            out.append(AnchorCheck(tenant, seq, False, f"anchored event {seq} is missing"))
        elif bytes(found) != digest:
            out.append(AnchorCheck(tenant, seq, False,
                                   f"event {seq} has hash {bytes(found).hex()}, anchored {digest.hex()}"))
        else:
            out.append(AnchorCheck(tenant, seq, True, None))
    return out


@dataclass(frozen=True)
class Unanchored:
    """A tenant's events after its last anchor: no anchor vouches for them."""

    tenant_id: uuid.UUID
    last_anchored_seq: int | None  # None: the tenant has no anchor at all
    head_seq: int

    @property
    def events(self) -> int:
        return self.head_seq - (self.last_anchored_seq or 0)

    def __str__(self) -> str:
        if self.last_anchored_seq is None:
            return f"no anchor covers this tenant: events 1..{self.head_seq} are vouched for by nothing"
        return (f"events {self.last_anchored_seq + 1}..{self.head_seq} came after the last anchor "
                f"(seq {self.last_anchored_seq}); no anchor vouches for them")


def unanchored(conn: Executor, anchors: list[tuple[uuid.UUID, int, bytes]],
               tenant: uuid.UUID | None = None) -> list[Unanchored]:
    """For each tenant with events (or the one asked for), what its anchors do not cover."""
    last: dict[uuid.UUID, int] = {}
    for t, seq, _ in anchors:
        last[t] = max(seq, last.get(t, 0))
    out = []
    for h in heads(conn, tenant):
        covered = last.get(h.tenant_id)
        if covered is None or covered < h.seq:
            out.append(Unanchored(h.tenant_id, covered, h.seq))
    return out


def events(conn: Executor, tenant: uuid.UUID, *, from_seq: int = 1,
           limit: int | None = None) -> list[ChainEvent]:
    """A tenant's events in order, with row ids parsed exactly (numbers as Decimal)."""
    rows = _run(conn, """
        select tenant_id, seq, recorded_at, table_name, row_id::text as row_id, operation, actor_user,
               actor_role, activity_id, row_hash, prev_hash, hash
          from provenance.events where tenant_id = :t and seq >= :f order by seq limit :n""",
                {"t": tenant, "f": from_seq, "n": limit})
    return [ChainEvent(r.tenant_id, r.seq, r.recorded_at, r.table_name,
                       json.loads(r.row_id, parse_float=Decimal), r.operation, r.actor_user,
                       r.actor_role, r.activity_id, bytes(r.row_hash), bytes(r.prev_hash),
                       bytes(r.hash)) for r in rows]
