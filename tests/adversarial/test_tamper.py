"""Tamper classes: what ``engram audit verify`` detects, and the one thing anchors cannot.

Each case tampers as a superuser would and checks that verification points at it. The
classes already proven in ``tests/test_provenance_chain.py`` (an event edited, deleted or
reordered; a row edited or deleted behind the chain's back; an anchored event rewritten)
are not repeated here. This file adds: a row inserted without an event; a deleted row
brought back; an event forged into the middle; the chain's tail cut off; the chain
rewritten consistently from the edited row's event on (only an anchor catches it); a
superuser's UPDATE with the triggers on (chained like any write: a warning names the
role); and an edit followed by a correctly hashed event that claims ``engram_app``,
appended after the last anchor, which passes every check (the documented limit), while
``verify --anchors`` says plainly that no anchor vouches for it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from orchestrator.audit.canonical import ChainEvent
from orchestrator.audit.chain import check_anchors, events, heads, unanchored, verify
from orchestrator.cli.main import app
from orchestrator.config import Settings
from orchestrator.db.session import bound_session
from tests.conftest import TenantFixture
from tests.support.provenance import as_superuser, auditor_engine, put

__all__ = ["auditor_engine"]

TenantMaker = Callable[..., TenantFixture]
runner = CliRunner()


@pytest.fixture
def chained(app_engine: Engine, tenant_factory: TenantMaker) -> tuple[TenantFixture, uuid.UUID]:
    t = tenant_factory("team")
    first = put(app_engine, t, "one.md")
    put(app_engine, t, "two.md")
    return t, first


def report(auditor: Engine, t: TenantFixture) -> Any:
    with auditor.connect() as conn:
        (rep,) = verify(conn, t.id)
    return rep


def anchor(auditor: Engine, t: TenantFixture) -> list[tuple[uuid.UUID, int, bytes]]:
    with auditor.connect() as conn:
        (head,) = heads(conn, t.id)
    return [(head.tenant_id, head.seq, head.hash)]


def superuser_name(admin_engine: Engine) -> str:
    return str(make_url(str(admin_engine.url)).username)


def test_a_row_inserted_without_an_event(admin_engine: Engine, auditor_engine: Engine,
                                         chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, first = chained
    forged = uuid.uuid4()
    cols = _stored_columns(admin_engine)
    as_superuser(admin_engine, f"insert into sources.documents ({cols}) select {cols} from "
                               "jsonb_populate_record(null::sources.documents, (select to_jsonb(d) || "
                               "jsonb_build_object('id', cast(:f as text), 'path', 'forged.md') "
                               "from sources.documents d where id = :d))", {"f": forged, "d": first})
    rep = report(auditor_engine, t)
    assert rep.chain_break is None
    assert [(p.table_name, p.row_id, p.problem) for p in rep.row_problems] == [
        ("sources.documents", {"id": str(forged)}, "row has no chain event")]


def test_a_deleted_row_brought_back(app_engine: Engine, admin_engine: Engine, auditor_engine: Engine,
                                    chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, first = chained
    with admin_engine.connect() as conn:
        saved = conn.execute(text("select to_jsonb(d)::text from sources.documents d where id = :d"),
                             {"d": first}).scalar_one()
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        s.execute(text("delete from sources.documents where id = :d"), {"d": first})
    cols = _stored_columns(admin_engine)
    as_superuser(admin_engine, f"insert into sources.documents ({cols}) select {cols} from "
                               "jsonb_populate_record(null::sources.documents, cast(:row as jsonb))",
                 {"row": saved})
    rep = report(auditor_engine, t)
    assert rep.chain_break is None
    assert ("sources.documents", {"id": str(first)}, "row exists but its latest chain event deleted it") in [
        (p.table_name, p.row_id, p.problem) for p in rep.row_problems]


def test_an_event_forged_into_the_middle(admin_engine: Engine, auditor_engine: Engine,
                                         chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, _ = chained
    as_superuser(admin_engine, """
        update provenance.events set seq = seq + 1000 where tenant_id = :t and seq >= 3;
        update provenance.events set seq = seq - 999 where tenant_id = :t and seq >= 1003;
        insert into provenance.events (tenant_id, seq, recorded_at, table_name, row_id, operation,
               actor_user, actor_role, activity_id, row_hash, prev_hash, hash)
        select tenant_id, 3, recorded_at, table_name, row_id, 'UPDATE', 'mallory', actor_role, activity_id,
               row_hash, hash, sha256(hash) from provenance.events where tenant_id = :t and seq = 2""",
                 {"t": t.id})
    rep = report(auditor_engine, t)
    assert rep.chain_break is not None and rep.chain_break.seq == 3, rep.chain_break


def test_the_tail_cut_off(app_engine: Engine, admin_engine: Engine, auditor_engine: Engine,
                          chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, _ = chained
    anchored = anchor(auditor_engine, t)
    put(app_engine, t, "three.md")
    with admin_engine.connect() as conn:
        head = int(conn.execute(text("select max(seq) from provenance.events where tenant_id = :t"),
                                {"t": t.id}).scalar_one())
    cut = anchored[0][1]  # everything from the anchored event on
    as_superuser(admin_engine, "delete from provenance.events where tenant_id = :t and seq >= :s",
                 {"t": t.id, "s": cut})
    rep = report(auditor_engine, t)
    # What is left still links: the chain alone cannot see a missing tail ...
    assert rep.chain_break is None and rep.checked == cut - 1 < head
    # ... the rows can (three.md has no event any more), and so can the anchor.
    assert any(p.problem == "row has no chain event" for p in rep.row_problems)
    with auditor_engine.connect() as conn:
        (chk,) = check_anchors(conn, anchored)
    assert not chk.ok and chk.problem == f"anchored event {cut} is missing"


def test_a_consistent_rewrite_passes_the_chain_and_the_rows_and_fails_the_anchor(
        admin_engine: Engine, auditor_engine: Engine, chained: tuple[TenantFixture, uuid.UUID]) -> None:
    t, first = chained
    anchored = anchor(auditor_engine, t)
    as_superuser(admin_engine, "update sources.documents set title = 'rewritten' where id = :d", {"d": first})
    with admin_engine.connect() as conn:
        new_hash = _version(conn, t, first)
        evs = events(conn, t.id)
    latest = max(e.seq for e in evs if e.table_name == "sources.documents" and e.row_id == {"id": str(first)})
    _rewrite_from(admin_engine, evs, latest, {latest: new_hash})
    rep = report(auditor_engine, t)
    assert rep.ok, "chain and rows agree again: the rewrite is consistent"
    with auditor_engine.connect() as conn:
        (chk,) = check_anchors(conn, anchored)
    assert not chk.ok and "anchored" in (chk.problem or "")


def test_a_superusers_update_with_the_triggers_on_is_a_warning_naming_the_role(
        admin_engine: Engine, auditor_engine: Engine, chained: tuple[TenantFixture, uuid.UUID],
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    t, first = chained
    role = superuser_name(admin_engine)
    with admin_engine.begin() as conn:  # the chain trigger records it like any write
        conn.execute(text("update sources.documents set title = 'edited by a superuser' where id = :d"),
                     {"d": first})
    rep = report(auditor_engine, t)
    # Before: verify passed silently. The chain and the rows agree, so it still passes, with a warning.
    assert rep.ok
    (w,) = rep.warnings
    assert (w.role, w.operation, w.events) == (role, "UPDATE", 1)
    assert f"written by role {role!r}, which is not one of Engram's writers" in str(w)

    _cli_env(settings, monkeypatch)
    res = runner.invoke(app, ["audit", "verify", "--tenant", t.org_id])
    assert res.exit_code == 0, res.output
    assert f"WARNING {t.org_id} ({t.id}): 1 UPDATE event(s) written by role {role!r}" in res.output
    strict = runner.invoke(app, ["audit", "verify", "--tenant", t.org_id, "--strict"])
    assert strict.exit_code == 1


def test_an_event_forged_after_the_last_anchor_passes_and_is_said_to_be_unanchored(
        admin_engine: Engine, auditor_engine: Engine, chained: tuple[TenantFixture, uuid.UUID],
        settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    t, first = chained
    anchored = anchor(auditor_engine, t)
    anchors = tmp_path / "anchors.jsonl"
    anchors.write_text(json.dumps({"tenant_id": str(t.id), "seq": anchored[0][1],
                                   "hash": anchored[0][2].hex()}) + "\n")
    # The superuser edits a row with the triggers off, then appends the event the chain
    # trigger would have written, hashed correctly and claiming engram_app.
    as_superuser(admin_engine, "update sources.documents set title = 'quietly changed' where id = :d",
                 {"d": first})
    with admin_engine.connect() as conn:
        row_hash = _version(conn, t, first)
        (head,) = heads(conn, t.id)
    forged = ChainEvent(t.id, head.seq + 1, datetime.now(UTC), "sources.documents", {"id": str(first)},
                        "UPDATE", "alice", "engram_app", None, row_hash, head.hash, b"")
    _insert(admin_engine, forged)

    rep = report(auditor_engine, t)
    assert rep.ok and rep.warnings == [], "the documented limit: nothing in the database contradicts it"
    with auditor_engine.connect() as conn:
        assert [c.ok for c in check_anchors(conn, anchored)] == [True]
        (gap,) = unanchored(conn, anchored, t.id)
    assert (gap.last_anchored_seq, gap.head_seq) == (anchored[0][1], head.seq + 1)

    _cli_env(settings, monkeypatch)
    res = runner.invoke(app, ["audit", "verify", "--tenant", t.org_id, "--anchors-from", str(anchors)])
    assert res.exit_code == 0, res.output
    assert f"ANCHOR OK {t.id} seq {anchored[0][1]}" in res.output
    assert (f"NOT ANCHORED {t.org_id} ({t.id}): events {anchored[0][1] + 1}..{head.seq + 1} came after "
            f"the last anchor (seq {anchored[0][1]}); no anchor vouches for them") in res.output
    strict = runner.invoke(app, ["audit", "verify", "--tenant", t.org_id, "--anchors", str(anchors),
                                 "--strict"])
    assert strict.exit_code == 1


# -- helpers --------------------------------------------------------------------------------

def _cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_HOME", str(settings.home))
    monkeypatch.setenv("ENGRAM_DB_PORT", str(settings.db_port))
    monkeypatch.setenv("ENGRAM_DB_NAME", settings.db_name)
    if settings.database_url:
        monkeypatch.setenv("ENGRAM_DATABASE_URL", settings.database_url)
        monkeypatch.setenv("ENGRAM_AUDITOR_PASSWORD", settings.auditor_password or "")


def _stored_columns(admin_engine: Engine) -> str:
    """sources.documents' columns that are not generated (an INSERT may name only those)."""
    with admin_engine.connect() as conn:
        return str(conn.execute(text(
            "select string_agg(quote_ident(attname), ', ' order by attnum) from pg_attribute "
            "where attrelid = 'sources.documents'::regclass and attnum > 0 and not attisdropped "
            "and attgenerated = ''")).scalar_one())


def _version(conn: Any, t: TenantFixture, document: uuid.UUID) -> bytes:
    return bytes(conn.execute(text(
        "select provenance.audit_row_version('sources.documents', "
        "jsonb_build_object('id', cast(:d as text)), :t)"), {"d": document, "t": t.id}).scalar_one())


def _sealed(ev: ChainEvent) -> ChainEvent:
    probe = ChainEvent(ev.tenant_id, ev.seq, ev.recorded_at, ev.table_name, ev.row_id, ev.operation,
                       ev.actor_user, ev.actor_role, ev.activity_id, ev.row_hash, ev.prev_hash, b"")
    return ChainEvent(*[getattr(probe, f) for f in (
        "tenant_id", "seq", "recorded_at", "table_name", "row_id", "operation", "actor_user",
        "actor_role", "activity_id", "row_hash", "prev_hash")], hash=probe.computed_hash())


def _insert(admin_engine: Engine, ev: ChainEvent) -> None:
    ev = _sealed(ev)
    as_superuser(admin_engine, "insert into provenance.events (tenant_id, seq, recorded_at, table_name, "
                               "row_id, operation, actor_user, actor_role, activity_id, row_hash, prev_hash, "
                               "hash) values (:t, :s, :at, :tab, cast(:rid as jsonb), :op, :u, :r, :a, :rh, "
                               ":ph, :h)",
                 {"t": ev.tenant_id, "s": ev.seq, "at": ev.recorded_at, "tab": ev.table_name,
                  "rid": json.dumps(ev.row_id), "op": ev.operation, "u": ev.actor_user, "r": ev.actor_role,
                  "a": ev.activity_id, "rh": ev.row_hash, "ph": ev.prev_hash, "h": ev.hash})


def _rewrite_from(admin_engine: Engine, evs: list[ChainEvent], start: int,
                  row_hashes: dict[int, bytes]) -> None:
    """Re-hash the chain from ``start`` on, with new row versions where given: what a superuser
    who wants the chain to agree with an edited row does."""
    prev = next(e.hash for e in evs if e.seq == start - 1) if start > 1 else bytes(32)
    for e in (e for e in evs if e.seq >= start):
        fresh = _sealed(ChainEvent(e.tenant_id, e.seq, e.recorded_at, e.table_name, e.row_id, e.operation,
                                   e.actor_user, e.actor_role, e.activity_id,
                                   row_hashes.get(e.seq, e.row_hash), prev, b""))
        as_superuser(admin_engine, "update provenance.events set row_hash = :rh, prev_hash = :ph, hash = :h "
                                   "where tenant_id = :t and seq = :s",
                     {"rh": fresh.row_hash, "ph": fresh.prev_hash, "h": fresh.hash, "t": e.tenant_id,
                      "s": e.seq})
        prev = fresh.hash
