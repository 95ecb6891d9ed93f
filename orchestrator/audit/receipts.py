"""Recall receipts: what was served to whom, provable later.

Recall calls ``append_served`` once per answer, in the request's
``bound_session``: who asked (the bound user), when, the SHA-256 of the
question and of the rendered string, and each evidence row with the version
(hash of its canonical image) that was served. The database refuses a receipt
whose evidence is not at the version named or not visible to the asker, seals
it with ``receipt_hash`` and keeps it append-only. Its chain event is queued in
the same transaction (``provenance.receipt_queue``, migration 0040) and appended
by ``chain_receipts``, which a background thread of the recalling process (and
``engram worker run``) calls in batches: the receipt and its queued event commit
together, so no crash loses either.

``verify_receipt`` re-derives the seal from the stored fields, checks the
receipt row against its chain event, checks that each served version is in the
chain for its row, and compares it with the row's current version: a receipt
whose evidence has changed since, or was tampered with, does not verify; one
still in the queue is reported as such (sealed, not yet proven).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.db.session import translate
from orchestrator.errors import BadInput, NotFound

Executor = Connection | Session
Evidence = tuple[str, dict[str, Any], bytes | None]


def _sha(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def version_of(session: Session, table: str, row_id: dict[str, Any]) -> bytes:
    """The current version of a row the bound identity can see."""
    try:
        found = session.execute(text(
            "select provenance.row_version(cast(:t as regclass), cast(:r as jsonb))"),
            {"t": table, "r": json.dumps(row_id)}).scalar()
    except DBAPIError as exc:
        raise translate(exc) from exc
    if found is None:
        raise NotFound(f"{table} {json.dumps(row_id)} does not exist or is not visible")
    return bytes(found)


def append_receipt(session: Session, question: str, evidence: list[Evidence], rendered: str) -> uuid.UUID:
    """Write the receipt of one recall; a ``None`` version means "as it is now"."""
    if not isinstance(question, str) or not isinstance(rendered, str):
        raise BadInput("question and rendered must be text")
    items = []
    for n, item in enumerate(evidence):
        if len(item) != 3 or not isinstance(item[0], str) or not isinstance(item[1], dict):
            raise BadInput(f"evidence {n} must be (table, row id dict, version bytes or None)")
        table, row_id, version = item
        if version is None:
            version = version_of(session, table, row_id)
        if not isinstance(version, bytes) or len(version) != 32:
            raise BadInput(f"evidence {n}: a version is 32 bytes (SHA-256)")
        items.append({"table": table, "row_id": row_id, "version": version.hex()})
    try:
        rid: uuid.UUID = session.execute(text(
            "insert into provenance.receipts (question_hash, evidence, rendered_hash) "
            "values (:q, cast(:e as jsonb), :r) returning id"),
            {"q": _sha(question), "e": json.dumps(items), "r": _sha(rendered)}).scalar_one()
    except DBAPIError as exc:
        raise translate(exc) from exc
    return rid


def append_served(session: Session, question: str, served: list[tuple[str, uuid.UUID]],
                  rendered: str) -> uuid.UUID:
    """Recall's receipt in one statement, in the transaction that served the rows: the
    evidence names them without versions, and the seal trigger pins each one as it is now
    (one ``provenance.row_versions`` probe per table; migration 0040), so every served
    row is hashed once."""
    evidence = [{"table": t, "row_id": {"id": str(i)}} for t, i in served]
    try:
        rid: uuid.UUID = session.execute(text(
            "insert into provenance.receipts (question_hash, evidence, rendered_hash) "
            "values (:q, cast(:e as jsonb), :r) returning id"),
            {"q": _sha(question), "r": _sha(rendered), "e": json.dumps(evidence)}).scalar_one()
    except DBAPIError as exc:
        raise translate(exc) from exc
    return rid


def chain_receipts(conn: Executor, limit: int = 1000) -> int:
    """Append up to ``limit`` queued receipts to their tenants' chains; returns how many.

    ``engram_app`` or ``engram_worker``; commit to keep them. Concurrent callers queue on
    each tenant's chain lock and never chain a receipt twice."""
    try:
        done = conn.execute(text("select provenance.chain_receipts(:n)"), {"n": limit}).scalar_one()
    except DBAPIError as exc:
        raise translate(exc) from exc
    return int(done)


@dataclass(frozen=True)
class EvidenceCheck:
    table: str
    row_id: dict[str, Any]
    served: bytes
    current: bytes | None
    in_chain: bool

    @property
    def status(self) -> str:
        if not self.in_chain:
            return "unproven"
        if self.current is None:
            return "deleted"
        return "unchanged" if self.current == self.served else "changed"


@dataclass(frozen=True)
class ReceiptCheck:
    id: uuid.UUID
    tenant_id: uuid.UUID
    asked_by: str
    asked_at: Any
    seal_ok: bool
    chain_ok: bool
    evidence: list[EvidenceCheck]
    rendered_ok: bool | None
    queued: bool = False  # sealed, its chain event still in provenance.receipt_queue
    seal: bytes = b""  # the stored receipt_hash
    rendered_hash: bytes = b""  # the stored sha256 of the rendered string

    def with_rendered(self, rendered: str) -> ReceiptCheck:
        """The check with ``rendered`` compared to what the recall rendered (no database
        read: the receipt's hash is here)."""
        return replace(self, rendered_ok=_sha(rendered) == self.rendered_hash)

    @property
    def proven(self) -> bool:
        """The receipt is genuine: its seal, its chain event and every served version (in
        the chain of its row) agree. Evidence may have changed since (an access counter, an
        edit): that is what ``ok`` adds."""
        return (self.seal_ok and self.chain_ok and self.rendered_ok is not False
                and all(e.in_chain for e in self.evidence))

    @property
    def ok(self) -> bool:
        """Proven, and every evidence row is still at the version served."""
        return self.proven and all(e.status == "unchanged" for e in self.evidence)

    def problems(self) -> list[str]:
        out = []
        if not self.seal_ok:
            out.append("the receipt's stored fields do not match its seal (receipt_hash)")
        if self.queued:
            out.append("the receipt is sealed and waits in the queue to be chained "
                       "(provenance.chain_receipts); it is not proven until then")
        elif not self.chain_ok:
            out.append("the receipt row does not match its chain event")
        if self.rendered_ok is False:
            out.append("the rendered text given does not match the receipt")
        for e in self.evidence:
            if e.status != "unchanged":
                out.append(f"evidence {e.table} {json.dumps(e.row_id)}: {e.status} "
                           f"(served {e.served.hex()[:16]}, now "
                           f"{e.current.hex()[:16] if e.current else 'gone'})")
        return out


def verify_receipt(conn: Executor, receipt_id: uuid.UUID, *, rendered: str | None = None,
                   tenant: uuid.UUID | None = None) -> ReceiptCheck:
    """Re-derive a receipt (run as an auditor: reads provenance and row hashes only); with
    ``tenant``, a receipt of another tenant is ``NotFound`` like one that does not exist."""
    try:
        r = conn.execute(text("""
            select r.*, provenance.receipt_hash(r.tenant_id, r.id, r.asked_by, r.asked_at, r.question_hash,
                                                r.evidence, r.rendered_hash) as resealed,
                   provenance.audit_row_version('provenance.receipts', jsonb_build_object('id', r.id),
                                                r.tenant_id) as current_version,
                   (select e.row_hash from provenance.events e
                     where e.tenant_id = r.tenant_id and e.table_name = 'provenance.receipts'
                       and e.row_id = jsonb_build_object('id', r.id) order by e.seq desc limit 1) as chained,
                   exists (select 1 from provenance.receipt_queue q
                            where q.tenant_id = r.tenant_id and q.id = r.id) as queued
              from provenance.receipts r
             where r.id = :id and (cast(:tenant as uuid) is null or r.tenant_id = :tenant)"""),
            {"id": receipt_id, "tenant": tenant}).one_or_none()
        if r is None:
            raise NotFound(f"no receipt {receipt_id}")
        checks = []
        for item in r.evidence:
            row = conn.execute(text("""
                select provenance.audit_row_version(cast(:t as text), cast(:r as jsonb), :tenant)
                           as current,
                       exists (select 1 from provenance.events e where e.tenant_id = :tenant
                                  and e.table_name = cast(:t as text) and e.row_id = cast(:r as jsonb)
                                  and e.row_hash = :v) as in_chain"""),
                {"t": item["table"], "r": json.dumps(item["row_id"]), "tenant": r.tenant_id,
                 "v": bytes.fromhex(item["version"])}).one()
            checks.append(EvidenceCheck(item["table"], item["row_id"], bytes.fromhex(item["version"]),
                                        bytes(row.current) if row.current is not None else None,
                                        bool(row.in_chain)))
    except DBAPIError as exc:
        raise translate(exc) from exc
    check = ReceiptCheck(
        r.id, r.tenant_id, r.asked_by, r.asked_at,
        seal_ok=bytes(r.resealed) == bytes(r.receipt_hash),
        chain_ok=r.chained is not None and r.current_version is not None
        and bytes(r.chained) == bytes(r.current_version),
        evidence=checks,
        rendered_ok=None,
        queued=bool(r.queued),
        seal=bytes(r.receipt_hash),
        rendered_hash=bytes(r.rendered_hash),
    )
    return check if rendered is None else check.with_rendered(rendered)
