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
MAX_LINEAGE_DEPTH = 50


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

                self._engine = create_engine(Database(self.settings).role_url("engram_auditor"),
                                             pool_size=2, max_overflow=2, pool_pre_ping=True)
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


@dataclass(frozen=True)
class ReceiptEvidenceView:
    table: str
    row_id: dict[str, Any]
    status: str  # unchanged, changed, deleted or unproven


@dataclass(frozen=True)
class ReceiptView:
    id: uuid.UUID
    asked_by: str
    asked_at: Any
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
        return ChainSummary(True, 0, None, None, None, None, [])
    r = reports[0]
    return ChainSummary(r.ok, r.checked, r.head_seq, r.head_hash.hex() if r.head_hash else None,
                        r.chain_break.seq if r.chain_break else None,
                        r.chain_break.problem if r.chain_break else None,
                        [f"{p.table_name} {p.row_id}: {p.problem}" for p in r.row_problems])


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
    return ReceiptView(check.id, check.asked_by, check.asked_at, check.proven, check.ok,
                       check.seal_ok, check.chain_ok, check.rendered_ok,
                       [ReceiptEvidenceView(e.table, e.row_id, e.status) for e in check.evidence],
                       check.problems())


def provenance(engine: Engine, tenant: uuid.UUID, table: str, row_id: Any, *,
               direction: Literal["back", "forward"] = "back", max_depth: int = 10) -> LineageView:
    """The derivation lineage of one row of the tenant, back to its origins or forward."""
    from orchestrator.audit.lineage import lineage

    if not isinstance(row_id, dict):
        raise BadInput('the row id is the row\'s key as a JSON object, e.g. {"id": "..."}')
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) \
            or not 1 <= max_depth <= MAX_LINEAGE_DEPTH:
        raise BadInput(f"max_depth must be between 1 and {MAX_LINEAGE_DEPTH}, not {max_depth!r}")
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
