"""Auditor calls shared by GraphQL (``verifyChain``, ``provenance``, ``verifyReceipt``), MCP
and the Python client.

Only an identity with the ``auditor`` role (token scope ``engram:auditor``) may
make them. They read as ``engram_auditor`` (keys and hashes, no content), and
only ever the caller's own tenant, whose id comes from the bound session, never
from an argument. A lineage asked for a row that has no chain event in the
caller's tenant is ``NotFound``: another tenant's row gets the same answer as a
row that exists nowhere.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.errors import BadInput, EngramError, Forbidden, NotFound

# A lineage walk is recursive and probes the chain per node: deep enough for any derivation
# Engram makes (a RAPTOR root over its levels), bounded for every caller.


class AuditorEngine:
    """engram_auditor's engine, made on first use (only auditor calls need it)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Engine:
        with self._lock:
            if self._engine is None:
                from sqlalchemy import create_engine

                from orchestrator.db.engine import Database
                from orchestrator.inputs import guard_engine

                self._engine = guard_engine(create_engine(
                    Database(self.settings).role_url("engram_auditor"), pool_size=2,
                    max_overflow=2, pool_pre_ping=True))
            return self._engine

    def dispose(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None


@dataclass(frozen=True)
class ChainSummary:
    ok: bool
    checked: int
    head_seq: int | None
    head_hash: str | None
    broken_at: int | None
    problem: str | None
    row_problems: list[str]
    warnings: list[str]


@dataclass(frozen=True)
class ReceiptEvidenceView:
    table: str
    row_id: dict[str, Any]
    served: str  # the row version the recall served (hex)
    status: str  # unchanged, changed, deleted or unproven


@dataclass(frozen=True)
class ReceiptView:
    id: uuid.UUID
    asked_by: str
    asked_at: Any
    seal: str  # the stored receipt hash (hex)
    proven: bool  # seal, chain event and every served version agree
    ok: bool  # proven, and every evidence row is still at the version served
    seal_ok: bool
    chain_ok: bool
    rendered_ok: bool | None
    evidence: list[ReceiptEvidenceView]
    problems: list[str]


@dataclass(frozen=True)
class LineageNodeView:
    table: str
    row_id: dict[str, Any]
    event_seqs: list[int]


@dataclass(frozen=True)
class LineageEdgeView:
    relation: str
    derived_table: str
    derived_row_id: dict[str, Any]
    source_table: str | None
    source_row_id: dict[str, Any] | None
    source_agent_id: uuid.UUID | None
    depth: int
    event_seq: int | None


@dataclass(frozen=True)
class LineageView:
    proven: bool
    nodes: list[LineageNodeView]
    edges: list[LineageEdgeView]


def auditor_tenant(session: Session, identity: Identity, what: str) -> uuid.UUID:
    """The caller's tenant id, for an auditor-only call; ``Forbidden`` for anyone else."""
    if "auditor" not in identity.roles:
        raise Forbidden(f"{what} is for auditors: the token needs the engram:auditor scope")
    tenant: uuid.UUID | None = session.execute(select(func.auth.tenant_id())).scalar_one()
    if tenant is None:
        raise EngramError("no tenant is bound to this session")
    return tenant


def verify_chain(engine: Engine, tenant: uuid.UUID, *, rows: bool = True) -> ChainSummary:
    """Recompute the tenant's provenance hash chain (and, with ``rows``, each row's hash)."""
    from orchestrator.audit import chain

    with engine.connect() as conn:
        reports = chain.verify(conn, tenant, rows=rows)
    if not reports:
        return ChainSummary(True, 0, None, None, None, None, [], [])
    r = reports[0]
    return ChainSummary(r.ok, r.checked, r.head_seq, r.head_hash.hex() if r.head_hash else None,
                        r.chain_break.seq if r.chain_break else None,
                        r.chain_break.problem if r.chain_break else None,
                        [f"{p.table_name} {p.row_id}: {p.problem}" for p in r.row_problems],
                        [str(w) for w in r.warnings])


def verify_receipt(engine: Engine, tenant: uuid.UUID, receipt_id: uuid.UUID, *,
                   rendered: str | None = None) -> ReceiptView:
    """Re-derive one recall receipt of the tenant (``engram audit receipt``): whether it is
    genuine and whether its evidence is still as served. Another tenant's receipt is
    ``NotFound``, as one that does not exist."""
    from orchestrator.audit.receipts import verify_receipt as verify

    if rendered is not None and not isinstance(rendered, str):
        raise BadInput("rendered is the text the recall returned")
    with engine.connect() as conn:
        check = verify(conn, receipt_id, rendered=rendered, tenant=tenant)
    return ReceiptView(check.id, check.asked_by, check.asked_at, check.seal.hex(), check.proven,
                       check.ok, check.seal_ok, check.chain_ok, check.rendered_ok,
                       [ReceiptEvidenceView(e.table, e.row_id, e.served.hex(), e.status)
                        for e in check.evidence],
                       check.problems())


def provenance(engine: Engine, tenant: uuid.UUID, table: str, row_id: Any, *,
               direction: Literal["back", "forward"] = "back", max_depth: int = 10) -> LineageView:
    """The derivation lineage of one row of the tenant, back to its origins or forward."""
    from orchestrator.audit.lineage import lineage

    if not isinstance(row_id, dict):
        raise BadInput('the row id is the row\'s key as a JSON object, e.g. {"id": "..."}')
    # lineage() bounds max_depth (audit.lineage.MAX_DEPTH), as for every caller.
    with engine.connect() as conn:
        found = lineage(conn, tenant, table, row_id, direction=direction, max_depth=max_depth)
    if not found.nodes[found.start].events:
        # Every write to a chained table is an event, so a row with none is not this tenant's.
        raise NotFound(f"no {table} row {json.dumps(row_id, sort_keys=True)} in this tenant's "
                       "provenance chain")
    return LineageView(
        found.proven(),
        [LineageNodeView(n.table, n.row_id, [e.seq for e in n.events]) for n in found.nodes.values()],
        [LineageEdgeView(e.relation, e.derived[0], found.nodes[e.derived].row_id,
                         e.source[0] if e.source else None,
                         found.nodes[e.source].row_id if e.source else None,
                         e.source_agent_id, e.depth, e.event.seq if e.event else None)
         for e in found.edges])


# --- the console's audit views (graphql/console.graphql); auditors only, own tenant only ---


@dataclass(frozen=True)
class ChainHeadView:
    seq: int
    hash: str
    recorded_at: Any
    anchor: str


def chain_head(engine: Engine, tenant: uuid.UUID) -> ChainHeadView | None:
    """The tenant's newest event, with the anchor line to keep outside the database."""
    from orchestrator.audit.chain import heads

    with engine.connect() as conn:
        found = heads(conn, tenant)
    if not found:
        return None
    h = found[0]
    return ChainHeadView(h.seq, h.hash.hex(), h.recorded_at, json.dumps(h.to_json()))


@dataclass(frozen=True)
class ChainStep:
    from_seq: int
    checked: int
    last_seq: int | None
    head_seq: int | None
    done: bool
    ok: bool
    broken_at: int | None
    problem: str | None
    row_problems: list[str]


MAX_STEP_EVENTS = 5000


def verify_chain_step(engine: Engine, tenant: uuid.UUID, *, from_seq: int = 1, limit: int = 500,
                      rows: bool = True) -> ChainStep:
    """Recompute events ``from_seq`` .. ``from_seq + limit - 1`` from the stored previous hash
    (the same canonical form the database hashes), so a long chain verifies in steps a client
    can show progress for; the step that reaches the head also checks the rows when asked."""
    from orchestrator.audit.canonical import GENESIS, verify_offline
    from orchestrator.audit.chain import events, heads
    from orchestrator.audit.chain import verify as verify_full

    if from_seq < 1:
        raise BadInput(f"fromSeq must be 1 or more, not {from_seq}")
    if not 1 <= limit <= MAX_STEP_EVENTS:
        raise BadInput(f"limit must be between 1 and {MAX_STEP_EVENTS}")
    with engine.connect() as conn:
        head = heads(conn, tenant)
        head_seq = head[0].seq if head else None
        before = events(conn, tenant, from_seq=from_seq - 1, limit=1) if from_seq > 1 else []
        if from_seq > 1 and (not before or before[0].seq != from_seq - 1):
            raise BadInput(f"event {from_seq - 1} does not exist; start from 1")
        batch = events(conn, tenant, from_seq=from_seq, limit=limit)
        brk = verify_offline(batch, prev=before[0].hash if before else GENESIS, first_seq=from_seq)
        last = batch[-1].seq if batch else None
        done = brk is not None or head_seq is None or (last is not None and last >= head_seq)
        problems: list[str] = []
        if done and brk is None and rows:
            report = verify_full(conn, tenant, from_seq=max(head_seq or 1, 1), rows=True)
            problems = [f"{p.table_name} {json.dumps(p.row_id, sort_keys=True)}: {p.problem}"
                        for r in report for p in r.row_problems]
    return ChainStep(from_seq, len(batch), last, head_seq, done, brk is None and not problems,
                     brk.seq if brk else None, brk.problem if brk else None, problems)


@dataclass(frozen=True)
class AnchorView:
    seq: int
    ok: bool
    problem: str | None


def check_anchors(engine: Engine, tenant: uuid.UUID, lines: str) -> list[AnchorView]:
    """Check anchors of this tenant; an anchor of another tenant is refused, not looked up."""
    from orchestrator.audit.chain import check_anchors as check
    from orchestrator.audit.chain import parse_anchors

    anchors = parse_anchors(lines.splitlines())
    if not anchors:
        raise BadInput("no anchor given: paste the JSON lines chainHead or `engram audit anchor` gave")
    if any(t != tenant for t, _, _ in anchors):
        raise BadInput("an anchor names another tenant; check only this tenant's anchors")
    with engine.connect() as conn:
        return [AnchorView(c.seq, c.ok, c.problem) for c in check(conn, anchors)]


@dataclass(frozen=True)
class ReceiptSummary:
    id: uuid.UUID
    asked_by: str
    asked_at: Any
    evidence_count: int


def receipts(engine: Engine, tenant: uuid.UUID, *, first: int = 20) -> list[ReceiptSummary]:
    if not 1 <= first <= 200:
        raise BadInput("first must be between 1 and 200")
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text(
            "select id, asked_by, asked_at, jsonb_array_length(evidence) as n "
            "from provenance.receipts where tenant_id = :t order by asked_at desc, id limit :n"),
            {"t": tenant, "n": first}).all()
    return [ReceiptSummary(r.id, r.asked_by, r.asked_at, r.n) for r in rows]


def provenance_export(engine: Engine, tenant: uuid.UUID, fmt: str = "jsonld") -> str:
    from orchestrator.audit.export import export

    if fmt not in ("jsonld", "ttl"):
        raise BadInput(f"format {fmt!r} is not jsonld or ttl")
    with engine.connect() as conn:
        return export(conn, tenant, fmt)  # type: ignore[arg-type]
