"""PROV-O agents, activities and derivations, and lineage walks over them.

Writers (ingest, derive, the worker) call ``begin_activity`` once per run or
request and ``record_derivation`` for each row they make from other rows: a
fact from a chunk, a summary from its members, an embedding from its model
(``agent=`` the model's agent). The database pins the current version hash of
each row named (which must be visible to the writer) and chains the edge, so
every step of a lineage is proven by chain events; ``record_derivations`` reads
the versions in bulk and the database checks them once per statement.

``lineage`` walks the edges backward (to origins) or forward (to what was
derived), and returns with every node the chain events of its row and with
every edge the event that recorded it. It reads ``provenance`` only, so an
auditor can run it without seeing any memory row.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.db.session import translate
from orchestrator.errors import BadInput
from orchestrator.inputs import one_of

Executor = Connection | Session
RowRef = tuple[str, dict[str, Any]]
RELATIONS = ("wasDerivedFrom", "wasQuotedFrom", "wasRevisionOf", "hadPrimarySource")
AGENT_KINDS = ("person", "software", "model", "organization")


def _exec(conn: Executor, sql: str, params: dict[str, Any]) -> Any:
    try:
        return conn.execute(text(sql), params)
    except DBAPIError as exc:
        raise translate(exc) from exc


def ensure_agent(session: Session, kind: str, name: str, version: str = "") -> uuid.UUID:
    """The id of the tenant's agent ``(kind, name, version)``, created if new."""
    one_of(kind, AGENT_KINDS, "agent kind")
    if not name:
        raise BadInput("an agent needs a name")
    params = {"k": kind, "n": name, "v": version}
    _exec(session, "insert into provenance.agents (kind, name, version) values (:k, :n, :v) "
                   "on conflict (tenant_id, kind, name, version) do nothing", params)
    found: uuid.UUID = _exec(session, "select id from provenance.agents where kind = :k and name = :n "
                                      "and version = :v", params).scalar_one()
    return found


def begin_activity(session: Session, kind: str, detail: dict[str, Any] | None = None,
                   agent: uuid.UUID | None = None) -> uuid.UUID:
    """Start an activity; chain events, derivations and receipts of this transaction name it."""
    started: uuid.UUID = _exec(session, "select provenance.begin_activity(:k, cast(:d as jsonb), :a)",
                               {"k": kind, "d": _json(detail or {}), "a": agent}).scalar_one()
    return started


def end_activity(session: Session, activity: uuid.UUID | None = None) -> None:
    _exec(session, "select provenance.end_activity(:a)", {"a": activity})


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


# One INSERT per batch, its rows from arrays in order, with the versions of the rows it names
# read by provenance.current_versions (one row_versions probe per table; migration 0019)
# from the derived ends followed by the source ends. The database checks them once per
# statement (tg_derivations__check_versions). An end current_versions gives no version (a
# composite key, an unknown table) is pinned, or refused with its message, by the row
# trigger. So a batch is two probes per table, not two row_version calls per edge, and the
# statement-level chain trigger runs once per batch.
_DERIVATIONS = """
    with v as materialized (select provenance.current_versions(cast(:dt as text[]) || cast(:st as text[]),
                                                  cast(:di as jsonb[]) || cast(:si as jsonb[])) as a)
    insert into provenance.derivations (relation, derived_table, derived_row_id, derived_version,
                                        source_table, source_row_id, source_version)
    select :r, e.dt, e.di, v.a[e.ord], e.st, e.si, v.a[cast(:n as int) + e.ord]
      from unnest(cast(:dt as text[]), cast(:di as jsonb[]), cast(:st as text[]), cast(:si as jsonb[]))
           with ordinality as e(dt, di, st, si, ord), v
     order by e.ord"""


def record_derivations(session: Session, edges: list[tuple[RowRef, RowRef]], *,
                       relation: str = "wasDerivedFrom", batch: int = 5000) -> int:
    """``derived wasDerivedFrom source`` for many ``(derived, source)`` pairs, one statement per
    ``batch`` edges (a job that writes thousands of edges must not pay a statement, or two
    version lookups, each). Returns the count."""
    one_of(relation, RELATIONS, "relation")
    for start in range(0, len(edges), batch):
        part = edges[start:start + batch]
        params = {"r": relation, "n": len(part),
                  "dt": [d[0] for d, _ in part], "di": [_json(d[1]) for d, _ in part],
                  "st": [s[0] for _, s in part], "si": [_json(s[1]) for _, s in part]}
        try:
            session.execute(text(_DERIVATIONS), params)
        except DBAPIError as exc:
            raise translate(exc) from exc
    return len(edges)


def record_derivation(session: Session, derived: RowRef, sources: list[RowRef] | None = None, *,
                      agent: uuid.UUID | None = None,
                      relation: str = "wasDerivedFrom") -> int:
    """Record that ``derived`` was derived from each source row (and/or from ``agent``);
    returns how many edges were written."""
    one_of(relation, RELATIONS, "relation")
    sources = sources or []
    if not sources and agent is None:
        raise BadInput("a derivation needs at least one source row or a source agent")
    written = record_derivations(session, [(derived, src) for src in sources], relation=relation)
    if agent is not None:
        table, row_id = derived
        _exec(session, """
            insert into provenance.derivations (relation, derived_table, derived_row_id, source_agent_id)
            values (:r, :dt, cast(:di as jsonb), :a)""",
            {"r": relation, "dt": table, "di": _json(row_id), "a": agent})
        written += 1
    return written


@dataclass(frozen=True)
class EventRef:
    seq: int
    operation: str
    row_hash: bytes
    hash: bytes


@dataclass
class Node:
    table: str
    row_id: dict[str, Any]
    events: list[EventRef] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return (self.table, _json_key(self.row_id))


@dataclass(frozen=True)
class Edge:
    id: uuid.UUID
    relation: str
    derived: tuple[str, str]
    derived_version: bytes
    source: tuple[str, str] | None
    source_version: bytes | None
    source_agent_id: uuid.UUID | None
    activity_id: uuid.UUID | None
    event: EventRef | None
    depth: int


@dataclass
class Lineage:
    start: tuple[str, str]
    direction: str
    nodes: dict[tuple[str, str], Node]
    edges: list[Edge]

    def proven(self) -> bool:
        """Every edge is in the chain, and each version it names is a chained version of its row."""
        for e in self.edges:
            if e.event is None:
                return False
            if e.derived_version not in {x.row_hash for x in self.nodes[e.derived].events}:
                return False
            if e.source is not None and e.source_version not in {
                    x.row_hash for x in self.nodes[e.source].events}:
                return False
        return True


# Deeper than any derivation Engram makes (RAPTOR levels + communities + claims + chunks);
# the walk is bounded by it whatever a caller asks for.
MAX_DEPTH = 100


def _json_key(row_id: dict[str, Any]) -> str:
    import json

    return json.dumps(row_id, sort_keys=True, separators=(",", ":"))


def lineage(conn: Executor, tenant: uuid.UUID, table: str, row_id: dict[str, Any], *,
            direction: Literal["back", "forward"] = "back", max_depth: int = 20) -> Lineage:
    """Derivation edges from a row to its origins (back) or to what was derived from it (forward)."""
    if direction not in ("back", "forward"):
        raise BadInput("direction is back or forward")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or \
            not 1 <= max_depth <= MAX_DEPTH:
        raise BadInput(f"max_depth must be 1 to {MAX_DEPTH}, not {max_depth!r}")
    near, far = ("derived", "source") if direction == "back" else ("source", "derived")
    rows = _exec(conn, f"""
        with recursive walk as (
            select d.*, 1 as depth from provenance.derivations d
             where d.tenant_id = :t and d.{near}_table = :tbl and d.{near}_row_id = cast(:rid as jsonb)
            union
            select d.*, w.depth + 1 from walk w join provenance.derivations d
              on d.tenant_id = w.tenant_id and d.{near}_table = w.{far}_table
             and d.{near}_row_id = w.{far}_row_id
             where w.depth < :max and w.{far}_table is not null
        )
        select w.id, w.relation, w.derived_table, w.derived_row_id, w.derived_version, w.source_table,
               w.source_row_id, w.source_version, w.source_agent_id, w.activity_id, min(w.depth) as depth,
               e.seq, e.operation, e.row_hash, e.hash
          from walk w
          left join provenance.events e on e.tenant_id = w.tenant_id
               and e.table_name = 'provenance.derivations' and e.row_id = jsonb_build_object('id', w.id)
         group by w.id, w.relation, w.derived_table, w.derived_row_id, w.derived_version, w.source_table,
                  w.source_row_id, w.source_version, w.source_agent_id, w.activity_id,
                  e.seq, e.operation, e.row_hash, e.hash
         order by depth, w.id""",
                 {"t": tenant, "tbl": table, "rid": _json(row_id), "max": max_depth}).all()
    nodes: dict[tuple[str, str], Node] = {}
    start = Node(table, row_id)
    nodes[start.key] = start
    edges = []
    for r in rows:
        d = Node(r.derived_table, r.derived_row_id)
        nodes.setdefault(d.key, d)
        s_key = None
        if r.source_table is not None:
            s = Node(r.source_table, r.source_row_id)
            nodes.setdefault(s.key, s)
            s_key = s.key
        ev = EventRef(r.seq, r.operation, bytes(r.row_hash), bytes(r.hash)) if r.seq is not None else None
        edges.append(Edge(r.id, r.relation, d.key, bytes(r.derived_version), s_key,
                          bytes(r.source_version) if r.source_version is not None else None,
                          r.source_agent_id, r.activity_id, ev, r.depth))
    for node in nodes.values():
        node.events = [EventRef(e.seq, e.operation, bytes(e.row_hash), bytes(e.hash)) for e in _exec(conn, """
            select seq, operation, row_hash, hash from provenance.events
             where tenant_id = :t and table_name = :tbl and row_id = cast(:rid as jsonb) order by seq""",
            {"t": tenant, "tbl": node.table, "rid": _json(node.row_id)}).all()]
    return Lineage(start.key, direction, nodes, edges)
