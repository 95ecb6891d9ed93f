"""Recall receipts: appended in the asker's session, re-derived by the auditor."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text, update

from orchestrator.audit.receipts import append_receipt, chain_receipts, verify_receipt, version_of
from orchestrator.db.models import Document
from orchestrator.db.session import bound_session
from orchestrator.errors import BadInput, Forbidden, NotFound
from tests.conftest import TenantFixture
from tests.support.provenance import as_superuser, auditor_engine, put

__all__ = ["auditor_engine"]

TenantMaker = Callable[..., TenantFixture]
DOCS = "sources.documents"


def _receipt(app_engine: Engine, t: TenantFixture, docs: list[uuid.UUID]) -> uuid.UUID:
    """A receipt, chained (its chain event is queued at insert and appended in batches: 0040)."""
    with bound_session(app_engine, t.identity("asker", read=("team",))) as s:
        evidence = [(DOCS, {"id": str(d)}, version_of(s, DOCS, {"id": str(d)})) for d in docs]
        rid = append_receipt(s, "what about the river?", evidence, "The river is wide.")
    with app_engine.begin() as conn:
        chain_receipts(conn)
    return rid


def test_receipt_verifies_and_a_changed_evidence_version_fails(
        app_engine: Engine, auditor_engine: Engine, tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team")
    a, b = put(app_engine, t, "a.md"), put(app_engine, t, "b.md")
    rid = _receipt(app_engine, t, [a, b])
    with auditor_engine.connect() as conn:
        chk = verify_receipt(conn, rid, rendered="The river is wide.")
        assert chk.ok and chk.asked_by == "asker", chk.problems()
        assert [e.status for e in chk.evidence] == ["unchanged", "unchanged"]
        assert verify_receipt(conn, rid, rendered="Something else.").ok is False
    with bound_session(app_engine, t.identity("writer", write=("team",))) as s:
        s.execute(update(Document).where(Document.id == b).values(title="A new title"))
    with auditor_engine.connect() as conn:
        chk = verify_receipt(conn, rid)
    assert not chk.ok
    assert [e.status for e in chk.evidence] == ["unchanged", "changed"]
    assert any("changed" in p and str(b) in p for p in chk.problems())


def test_tampered_receipt_fails(app_engine: Engine, admin_engine: Engine, auditor_engine: Engine,
                                tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team")
    a = put(app_engine, t, "a.md")
    rid = _receipt(app_engine, t, [a])
    fake = "0" * 64
    as_superuser(admin_engine, "update provenance.receipts set evidence = jsonb_set(evidence, "
                               "'{0,version}', to_jsonb(cast(:v as text))) where id = :r",
                 {"v": fake, "r": rid})
    with auditor_engine.connect() as conn:
        chk = verify_receipt(conn, rid)
    assert not chk.ok and not chk.seal_ok and not chk.chain_ok
    assert chk.evidence[0].status == "unproven"


def test_receipt_bad_input_writes_nothing(app_engine: Engine, auditor_engine: Engine,
                                          tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team", "exec")
    a = put(app_engine, t, "a.md")
    ident = t.identity("asker", read=("team",))
    with pytest.raises(BadInput, match="now at version"), bound_session(app_engine, ident) as s:
        append_receipt(s, "q", [(DOCS, {"id": str(a)}, b"\x01" * 32)], "r")
    with pytest.raises(NotFound), bound_session(app_engine, ident) as s:
        append_receipt(s, "q", [(DOCS, {"id": str(uuid.uuid4())}, None)], "r")
    with pytest.raises(BadInput, match="32 bytes"), bound_session(app_engine, ident) as s:
        append_receipt(s, "q", [(DOCS, {"id": str(a)}, b"short")], "r")
    # Another tenant's reader cannot see a.md, so cannot claim it as evidence.
    other = tenant_factory("team")
    with pytest.raises(BadInput, match="not visible"), \
            bound_session(app_engine, other.identity("x", read=("team",))) as s:
        s.execute(text("insert into provenance.receipts (question_hash, evidence, rendered_hash) "
                       "values (sha256('q'), jsonb_build_array(jsonb_build_object("
                       "'table', 'sources.documents', 'row_id', jsonb_build_object('id', cast(:d as text)),"
                       " 'version', repeat('a', 64))),"
                       " sha256('r'))"), {"d": a})
    with pytest.raises(NotFound), auditor_engine.connect() as conn:
        verify_receipt(conn, uuid.uuid4())
    with auditor_engine.connect() as conn:
        n = conn.execute(text("select count(*) from provenance.receipts where tenant_id in (:a, :b)"),
                         {"a": t.id, "b": other.id}).scalar_one()
    assert n == 0
    # Receipts are append-only, for their writer too.
    rid = _receipt(app_engine, t, [a])
    with pytest.raises(Forbidden), bound_session(app_engine, ident) as s:
        s.execute(text("delete from provenance.receipts where id = :r"), {"r": rid})


def test_row_versions_equal_row_version_and_hide_what_the_caller_cannot_see(
        app_engine: Engine, tenant_factory: TenantMaker) -> None:
    """The batched probe recall's receipt uses (0016) gives exactly the per-row versions."""
    from orchestrator.audit.receipts import append_served

    t = tenant_factory("team", "exec")
    a, b = put(app_engine, t, "a.md"), put(app_engine, t, "b.md")
    from orchestrator.ingest.documents import DocumentInput, put_document

    with bound_session(app_engine, t.identity("boss", write=("exec",))) as s:
        secret = put_document(s, DocumentInput(collection="notes", path="secret.md", title="Secret",
                                               body="Only exec.", scopes=("exec",))).document_id
    reader = t.identity("asker", read=("team",))
    with bound_session(app_engine, reader) as s:
        batch = dict(s.execute(text("select id, version from provenance.row_versions("
                                    "'sources.documents', cast(:ids as uuid[]))"),
                               {"ids": [a, b, secret, uuid.uuid4()]}).all())
        assert set(batch) == {a, b}
        for d in (a, b):
            assert batch[d] == version_of(s, DOCS, {"id": str(d)})
        rid = append_served(s, "q", [(DOCS, b), (DOCS, a)], "r")
        evidence = s.execute(text("select evidence from provenance.receipts where id = :r"),
                             {"r": rid}).scalar_one()
        assert [e["row_id"]["id"] for e in evidence] == [str(b), str(a)]
        assert [e["version"] for e in evidence] == [batch[b].hex(), batch[a].hex()]
    with pytest.raises(BadInput, match="not a chained memory table"), \
            bound_session(app_engine, reader) as s:
        s.execute(text("select * from provenance.row_versions('auth.scopes', cast(:ids as uuid[]))"),
                  {"ids": [a]})


def test_the_seal_still_names_a_malformed_row_id(app_engine: Engine, tenant_factory: TenantMaker) -> None:
    """Items the per-table probe cannot take go through row_version and its message."""
    t = tenant_factory("team")
    a = put(app_engine, t, "a.md")
    ident = t.identity("asker", read=("team",))
    with bound_session(app_engine, ident) as s:
        version = version_of(s, DOCS, {"id": str(a)})
    with pytest.raises(BadInput, match="exactly the keys id"), bound_session(app_engine, ident) as s:
        append_receipt(s, "q", [(DOCS, {"id": str(a), "path": "a.md"}, version)], "r")
