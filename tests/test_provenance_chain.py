"""The chain: written by triggers for every memory write, verified, tamper-evident, linear."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from decimal import Decimal

import pytest
from sqlalchemy import Engine, delete, text, update

from orchestrator.audit import canonical
from orchestrator.audit.chain import check_anchors, events, heads, verify
from orchestrator.audit.lineage import begin_activity, end_activity
from orchestrator.db.models import Document
from orchestrator.db.session import bound_session
from orchestrator.errors import BadInput
from orchestrator.ingest.documents import put_document
from tests.conftest import TenantFixture
from tests.support.provenance import as_superuser, auditor_engine, doc, event_count, put

__all__ = ["auditor_engine"]

TenantMaker = Callable[..., TenantFixture]


def _one(engine: Engine, tenant: uuid.UUID, **kw: object):  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        reports = verify(conn, tenant, **kw)  # type: ignore[arg-type]
    assert len(reports) == 1
    return reports[0]


def _workload(app_engine: Engine, t: TenantFixture) -> uuid.UUID:
    """Inserts, an update that re-chunks, a scope-only update, a delete, inside an activity."""
    ident = t.identity("alice", write=tuple(t.scopes))
    with bound_session(app_engine, ident) as s:
        begin_activity(s, "ingest.run", {"source": "test"})
        a = put_document(s, doc("a.md")).document_id
        put_document(s, doc("b.md"))
        end_activity(s)
    with bound_session(app_engine, ident) as s:
        put_document(s, doc("a.md", "A new body that is different. " * 30))
        s.execute(update(Document).where(Document.path == "b.md").values(pinned=True))
    with bound_session(app_engine, ident) as s:
        s.execute(delete(Document).where(Document.path == "b.md"))
    return a


def test_mixed_workload_verifies(app_engine: Engine, admin_engine: Engine, auditor_engine: Engine,
                                 tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team")
    doc_a = _workload(app_engine, t)
    n = event_count(admin_engine, t.id)
    rep = _one(auditor_engine, t.id)
    assert rep.ok, (rep.chain_break, rep.row_problems)
    assert rep.checked == n and rep.head_seq == n
    with auditor_engine.connect() as conn:
        evs = events(conn, t.id)
        ops = {(e.table_name, e.operation) for e in evs}
        acts = conn.execute(text("select id, kind, actor_user, ended_at from provenance.activities "
                                 "where tenant_id = :t"), {"t": t.id}).all()
    assert [e.seq for e in evs] == list(range(1, n + 1))
    assert rep.head_hash == evs[-1].hash
    assert {("sources.documents", "INSERT"), ("sources.documents", "UPDATE"),
            ("sources.documents", "DELETE"), ("sources.chunks", "INSERT"),
            ("sources.chunks", "DELETE")} <= ops
    assert all(e.actor_role == "engram_app" and e.actor_user == "alice" for e in evs)
    # The activity names the events written while it ran, and only those.
    assert len(acts) == 1 and acts[0].kind == "ingest.run" and acts[0].ended_at is not None
    first_insert = next(e for e in evs if e.row_id == {"id": str(doc_a)})
    assert first_insert.activity_id == acts[0].id
    assert evs[-1].activity_id is None
    # An auditor can recompute the chain outside the database from the exported events.
    assert canonical.verify_offline(evs) is None


def test_row_images_follow_the_documented_canonical_form(
        app_engine: Engine, admin_engine: Engine, tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team")
    d = put(app_engine, t, "canon.md", "Ünïcode \"quotes\" and \\ backslashes\n" * 5)
    with admin_engine.begin() as conn:
        conn.execute(text("set local timezone = 'America/Sao_Paulo'"))
        conn.execute(text("set local extra_float_digits = 0"))
        conn.execute(text("set local bytea_output = 'escape'"))
        image = conn.execute(text(
            "select provenance.row_version('sources.documents', jsonb_build_object('id', cast(:d as text)),"
            " :t), (select row_hash from provenance.events where tenant_id = :t"
            " and row_id->>'id' = cast(:d as text) order by seq desc limit 1)"), {"d": d, "t": t.id}).one()
        canon = conn.execute(text(
            "select to_jsonb(d)::text from sources.documents d where id = :d"), {"d": d}).scalar_one()
    # Session settings of the reader do not change a version.
    assert bytes(image[0]) == bytes(image[1])
    # The Python form of the row image gives the same version as the database.
    parsed = json.loads(canon, parse_float=Decimal)
    assert canonical.jsonb_text(parsed) == canon
    with admin_engine.begin() as conn:
        conn.execute(text("set local timezone = 'UTC'"))
        conn.execute(text("set local bytea_output = 'hex'"))
        utc_image = conn.execute(text(
            "select to_jsonb(d)::text from sources.documents d where id = :d"), {"d": d}).scalar_one()
    assert canonical.row_version(json.loads(utc_image, parse_float=Decimal)) == bytes(image[1])


def test_verify_from_a_sequence_number_and_bad_input(
        app_engine: Engine, auditor_engine: Engine, tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team")
    for i in range(3):
        put(app_engine, t, f"{i}.md")
    full = _one(auditor_engine, t.id)
    part = _one(auditor_engine, t.id, from_seq=4)
    assert part.ok and part.checked == full.checked - 3 and part.head_hash == full.head_hash
    with pytest.raises(BadInput, match="1 or more"), auditor_engine.connect() as conn:
        verify(conn, t.id, from_seq=0)


def test_anchors_prove_the_past(app_engine: Engine, admin_engine: Engine, auditor_engine: Engine,
                                tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team")
    put(app_engine, t, "x.md")
    with auditor_engine.connect() as conn:
        (head,) = heads(conn, t.id)
    put(app_engine, t, "y.md")
    anchor = [(head.tenant_id, head.seq, head.hash)]
    with auditor_engine.connect() as conn:
        assert [c.ok for c in check_anchors(conn, anchor)] == [True]
    # A superuser rewrites the anchored event and re-hashes it: the anchor catches it.
    as_superuser(admin_engine, "update provenance.events set hash = sha256(hash) "
                               "where tenant_id = :t and seq = :s", {"t": t.id, "s": head.seq})
    with auditor_engine.connect() as conn:
        (chk,) = check_anchors(conn, anchor)
    assert not chk.ok and f"event {head.seq}" in (chk.problem or "")


# -- tampering: each case is detected and points at the right place ----------

@pytest.fixture
def chained(app_engine: Engine, tenant_factory: TenantMaker) -> tuple[TenantFixture, uuid.UUID]:
    t = tenant_factory("team")
    first = put(app_engine, t, "one.md")
    for i in range(3):
        put(app_engine, t, f"more-{i}.md")
    return t, first


def test_tamper_edited_event(admin_engine: Engine, auditor_engine: Engine,
                             chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, _ = chained
    assert _one(auditor_engine, t.id).ok
    as_superuser(admin_engine, "update provenance.events set actor_user = 'mallory' "
                               "where tenant_id = :t and seq = 3", {"t": t.id})
    rep = _one(auditor_engine, t.id)
    assert rep.chain_break is not None and rep.chain_break.seq == 3
    assert "altered" in rep.chain_break.problem
    assert rep.chain_break.expected_hash != rep.chain_break.found_hash
    assert rep.checked == 2


def test_tamper_memory_row_without_event(admin_engine: Engine, auditor_engine: Engine,
                                         chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, first = chained
    as_superuser(admin_engine, "update sources.documents set title = 'rewritten' where id = :d",
                 {"d": first})
    rep = _one(auditor_engine, t.id)
    assert rep.chain_break is None, "the chain itself is intact"
    assert not rep.ok
    (p,) = rep.row_problems
    assert (p.table_name, p.row_id) == ("sources.documents", {"id": str(first)})
    assert "differs" in p.problem
    with admin_engine.connect() as conn:
        latest = conn.execute(text(
            "select seq, row_hash from provenance.events where tenant_id = :t "
            "and table_name = 'sources.documents' and row_id = jsonb_build_object('id', cast(:d as text)) "
            "order by seq desc limit 1"), {"t": t.id, "d": first}).one()
    assert p.event_seq == latest.seq and p.expected_hash == bytes(latest.row_hash)
    assert p.found_hash is not None and p.found_hash != p.expected_hash


def test_tamper_rows_inserted_or_deleted_without_event(
        admin_engine: Engine, auditor_engine: Engine, chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, first = chained
    as_superuser(admin_engine, "delete from sources.chunks where document_id = :d", {"d": first})
    rep = _one(auditor_engine, t.id)
    assert rep.row_problems and all(p.table_name == "sources.chunks"
                                    and "deleted without" in p.problem for p in rep.row_problems)


def test_tamper_deleted_event(admin_engine: Engine, auditor_engine: Engine,
                              chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, _ = chained
    as_superuser(admin_engine, "delete from provenance.events where tenant_id = :t and seq = 4",
                 {"t": t.id})
    rep = _one(auditor_engine, t.id)
    assert rep.chain_break is not None and rep.chain_break.seq == 4
    assert "event 4 is missing (the next event is 5)" == rep.chain_break.problem


def test_tamper_reordered_pair(admin_engine: Engine, auditor_engine: Engine,
                               chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, _ = chained
    as_superuser(admin_engine, """
        update provenance.events set seq = 999999 where tenant_id = :t and seq = 5;
        update provenance.events set seq = 5 where tenant_id = :t and seq = 6;
        update provenance.events set seq = 6 where tenant_id = :t and seq = 999999""", {"t": t.id})
    rep = _one(auditor_engine, t.id)
    assert rep.chain_break is not None and rep.chain_break.seq == 5
    assert "does not link" in rep.chain_break.problem
    assert rep.checked == 4


# -- concurrency --------------------------------------------------------------

def test_concurrent_writers_leave_linear_gap_free_chains(
        app_engine: Engine, admin_engine: Engine, auditor_engine: Engine,
        tenant_factory: TenantMaker) -> None:
    tenants = [tenant_factory("team"), tenant_factory("team")]
    per_thread = 6
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        t = tenants[n % 2]
        try:
            start.wait()
            for i in range(per_thread):
                put(app_engine, t, f"w{n}-{i}.md", f"Writer {n} document {i}. " * 10)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t in tenants:
        with admin_engine.connect() as conn:
            seqs = list(conn.execute(text(
                "select seq from provenance.events where tenant_id = :t order by seq"),
                {"t": t.id}).scalars())
            docs = conn.execute(text(
                "select count(*) from provenance.events where tenant_id = :t "
                "and table_name = 'sources.documents' and operation = 'INSERT'"), {"t": t.id}).scalar_one()
        assert seqs == list(range(1, len(seqs) + 1)), "gap-free"
        assert docs == 4 * per_thread
        rep = _one(auditor_engine, t.id)
        assert rep.ok and rep.checked == len(seqs), "linear: every event links to the one before"


def test_deleting_a_tenant_keeps_its_record(app_engine: Engine, admin_engine: Engine,
                                            auditor_engine: Engine, tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team")
    put(app_engine, t, "gone.md")
    before = event_count(admin_engine, t.id)
    with admin_engine.begin() as conn:
        conn.execute(text("set local role engram_dba"))
        assert conn.execute(text("delete from auth.tenants where id = :t"), {"t": t.id}).rowcount == 1
    # The cascade's deletes are chained too, and the chain still verifies.
    with admin_engine.connect() as conn:
        ops = list(conn.execute(text(
            "select operation from provenance.events where tenant_id = :t and seq > :n order by seq"),
            {"t": t.id, "n": before}).scalars())
    assert ops and set(ops) == {"DELETE"}
    rep = _one(auditor_engine, t.id)
    assert rep.ok and rep.checked == before + len(ops)
