"""Decision hooks: marked items and decision documents become decisions with causal links."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from orchestrator.db.knowledge_models import Decision, DecisionLink, WorkingMemoryItem
from orchestrator.db.session import bound_session
from orchestrator.derive.decisions import record
from orchestrator.derive.service import ServiceTenant, service_session
from orchestrator.errors import BadInput
from orchestrator.ingest.documents import DocumentInput, put_document
from orchestrator.ingest.memory import add_working_memory
from tests.conftest import TenantFixture
from tests.support.derive import cli_env  # noqa: F401

Tenants = Callable[..., TenantFixture]
Marked = dict[str, uuid.UUID]


def _doc(app_engine: Engine, t: TenantFixture, collection: str, path: str, title: str, body: str,
         meta: dict[str, Any] | None = None, *, scopes: tuple[str, ...] = ("team",),
         kind: str = "decision", user: str = "dana") -> uuid.UUID:
    with bound_session(app_engine, t.identity(user, write=scopes)) as s:
        return put_document(s, DocumentInput(collection=collection, path=path, title=title, body=body,
                                             scopes=scopes, kind=kind, metadata=meta)).document_id


def _service(t: TenantFixture) -> ServiceTenant:
    return ServiceTenant(t.id, t.org_id, tuple(sorted(t.scopes)))


def _counts(admin_engine: Engine, t: TenantFixture) -> tuple[int, int, int]:
    with admin_engine.connect() as conn:
        found = tuple(int(conn.execute(text(sql), {"t": t.id}).scalar_one()) for sql in (
            "select count(*) from memory.decisions where tenant_id = :t",
            "select count(*) from memory.decision_links where tenant_id = :t",
            "select count(*) from provenance.events where tenant_id = :t"))
    return found  # type: ignore[return-value]


def _links(s: Any) -> set[tuple[uuid.UUID, uuid.UUID, str]]:
    return {(lk.from_decision_id, lk.to_decision_id, lk.kind)
            for lk in s.execute(select(DecisionLink)).scalars()}


@pytest.fixture
def tenant(tenant_factory: Tenants) -> TenantFixture:
    return tenant_factory("team", "exec")


@pytest.fixture
def marked(app_engine: Engine, tenant: TenantFixture) -> Marked:
    t = tenant
    ids = {
        "adr1": _doc(app_engine, t, "adr", "0001-postgres.md", "Adopt PostgreSQL",
                     "PostgreSQL owns the data.", {"category": "infra", "decided_at": "2024-01-01"}),
        "adr2": _doc(app_engine, t, "adr", "0002-queue.md", "Queue in PostgreSQL", "SKIP LOCKED is enough.",
                     {"category": "infra", "decided_at": "2024-03-01", "caused_by": "0001-postgres.md",
                      "confidence": "0.7", "outcome": "Shipped in March."}),
        "plan": _doc(app_engine, t, "notes", "plan.md", "Plan the migration", "One weekend.",
                     {"category": "process", "decided_at": "2024-04-01",
                      "influenced_by": "[adr/0002-queue.md]"}),
        "note": _doc(app_engine, t, "notes", "idea.md", "An idea", "Not a decision.", kind="note"),
    }
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        ids["item"] = add_working_memory(
            s, "s1", "Use PostgreSQL for the queue because SKIP LOCKED is enough.", ("team",),
            kind="decision", category="infra")
        ids["chat"] = add_working_memory(s, "s1", "Just chatting.", ("team",))
    return ids


def test_marked_items_become_decisions_with_causal_links_and_lineage(
        app_engine: Engine, admin_engine: Engine, tenant: TenantFixture, marked: Marked) -> None:
    t, m = tenant, marked
    with service_session(app_engine, _service(t)) as s:
        report = record(s)
        rows = {d.source_id: d for d in s.execute(select(Decision)).scalars()}
        links = _links(s)
    assert (report.recorded, report.updated, report.links, report.problems) == (4, 0, 4, [])
    assert set(rows) == {m["adr1"], m["adr2"], m["plan"], m["item"]}  # not the note, not the chat
    item, adr1, adr2, plan = rows[m["item"]], rows[m["adr1"]], rows[m["adr2"]], rows[m["plan"]]
    assert (item.source_table, item.category, item.decided_by) == ("memory.working_memory", "infra", "alice")
    assert item.scenario == "Use PostgreSQL for the queue"
    assert item.reasoning == "Because SKIP LOCKED is enough."
    assert item.scopes == [t.scopes["team"]]
    assert (adr2.scenario, adr2.reasoning, adr2.outcome, adr2.confidence) == (
        "Queue in PostgreSQL", "SKIP LOCKED is enough.", "Shipped in March.", 0.7)
    assert adr1.decided_at == datetime(2024, 1, 1, tzinfo=UTC) and adr2.decided_by == "dana"
    assert links == {
        (adr1.id, adr2.id, "precedent_for"),  # latest earlier decision of the same category
        (adr2.id, item.id, "precedent_for"),
        (adr1.id, adr2.id, "caused"),  # caused_by: a path in the same collection
        (adr2.id, plan.id, "influenced"),  # influenced_by: collection/path
    }
    with admin_engine.connect() as conn:
        edges = set(conn.execute(text(
            "select derived_table, derived_row_id ->> 'id', source_table, source_row_id ->> 'id' "
            "from provenance.derivations where tenant_id = :t and derived_table = 'memory.decisions'"),
            {"t": t.id}).all())
    assert edges == {("memory.decisions", str(rows[k].id), table, str(k)) for k, table in (
        (m["item"], "memory.working_memory"), (m["adr1"], "sources.documents"),
        (m["adr2"], "sources.documents"), (m["plan"], "sources.documents"))}
    # Marking is an act of recording: a reader of the scope sees the decision, never the item.
    with bound_session(app_engine, t.identity("bob", read=("team",))) as s:
        assert item.id in set(s.execute(select(Decision.id)).scalars())
        assert s.execute(select(WorkingMemoryItem)).scalars().all() == []


def test_rerun_changes_nothing_and_document_edits_follow(
        app_engine: Engine, admin_engine: Engine, tenant: TenantFixture, marked: Marked) -> None:
    t = tenant
    with service_session(app_engine, _service(t)) as s:
        record(s)
    counts = _counts(admin_engine, t)
    with service_session(app_engine, _service(t)) as s:
        again = record(s)
    assert (again.recorded, again.updated, again.links, again.problems) == (0, 0, 0, [])
    assert _counts(admin_engine, t) == counts
    _doc(app_engine, t, "adr", "0002-queue.md", "Queue in PostgreSQL", "SKIP LOCKED is enough.",
         {"category": "infra", "decided_at": "2024-03-01", "caused_by": "0001-postgres.md",
          "confidence": "0.9", "outcome": "Rolled back in April."})
    with service_session(app_engine, _service(t)) as s:
        third = record(s)
        outcome = s.execute(select(Decision.outcome, Decision.confidence)
                            .where(Decision.source_id == marked["adr2"])).one()
    assert (third.recorded, third.updated, third.links) == (0, 1, 0)
    assert tuple(outcome) == ("Rolled back in April.", 0.9)


def test_unresolved_references_wait_and_scopes_bound_links(
        app_engine: Engine, tenant: TenantFixture, tenant_factory: Tenants) -> None:
    t = tenant
    _doc(app_engine, t, "adr", "0003-cache.md", "No cache", "Not needed yet.",
         {"category": "infra", "caused_by": "0009-later.md"})
    _doc(app_engine, t, "adr", "0004-board.md", "Board approval", "Exec only.", {"category": "infra"},
         scopes=("exec",))
    with service_session(app_engine, _service(t)) as s:
        first = record(s)
        rows = {d.scenario: d for d in s.execute(select(Decision)).scalars()}
        links = _links(s)
    assert first.recorded == 2 and links == set()  # exec and team share no scope: no precedent
    assert first.problems == ["document adr/0003-cache.md: caused_by '0009-later.md' is not a decision "
                              "document you can write; the link waits for it"]
    _doc(app_engine, t, "adr", "0009-later.md", "Later", "It came later.", {"category": "ops"},
         scopes=("team", "exec"))
    with service_session(app_engine, _service(t)) as s:
        second = record(s)
        later = s.execute(select(Decision).where(Decision.scenario == "Later")).scalar_one()
        link = s.execute(select(DecisionLink).where(DecisionLink.kind == "caused")).scalar_one()
    assert (second.recorded, second.links, second.problems) == (1, 1, [])
    assert (link.from_decision_id, link.to_decision_id) == (later.id, rows["No cache"].id)
    assert link.scopes == [t.scopes["team"]]  # only the scope both ends share
    with bound_session(app_engine, t.identity("team-writer", write=("team",))) as s:
        team = s.execute(select(Decision.scenario)).scalars().all()
    assert sorted(team) == ["Later", "No cache"]  # never the exec decision
    other = tenant_factory("team")
    with service_session(app_engine, _service(other)) as s:
        assert record(s).recorded == 0
        assert s.execute(select(Decision)).scalars().all() == []


def test_bad_input_is_refused_and_writes_nothing(app_engine: Engine, admin_engine: Engine,
                                                 tenant: TenantFixture) -> None:
    t = tenant
    _doc(app_engine, t, "adr", "bad.md", "Bad", "Body.", {"confidence": "very"})
    _doc(app_engine, t, "adr", "worse.md", "Worse", "Body.", {"confidence": "1.5"})
    counts = _counts(admin_engine, t)
    with service_session(app_engine, _service(t)) as s:
        report = record(s)
    assert report.recorded == 0
    assert report.problems == ["document adr/bad.md: confidence 'very' is not a number",
                               "document adr/worse.md: confidence '1.5' is outside [0, 1]"]
    assert _counts(admin_engine, t) == counts
    before = _counts(admin_engine, t)
    for kw, message in (({"kind": "verdict"}, "kind 'verdict' is not one of note, decision"),
                        ({"category": "infra"}, "only an item marked as a decision has a category"),
                        ({"kind": "decision", "category": " "}, "category must not be empty"),
                        ({"kind": "decision", "category": "x" * 101}, "category is 101 characters")):
        with pytest.raises(BadInput, match=message), \
                bound_session(app_engine, t.identity("alice", write=("team",))) as s:
            add_working_memory(s, "s1", "We pick Rust.", ("team",), **kw)
    assert _counts(admin_engine, t) == before
    with bound_session(app_engine, t.identity("alice", read=("team",))) as s:
        assert s.execute(select(WorkingMemoryItem)).scalars().all() == []


def test_killed_mid_run_then_restarted_has_no_duplicates(
        app_engine: Engine, admin_engine: Engine, tenant: TenantFixture, marked: Marked,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.derive.decisions as job
    from orchestrator.audit.lineage import record_derivation as real

    t = tenant
    calls = [0]

    def crash_on_third(*args: object, **kw: object) -> object:
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt("killed")
        return real(*args, **kw)  # type: ignore[arg-type]

    counts = _counts(admin_engine, t)
    monkeypatch.setattr(job, "record_derivation", crash_on_third)
    with pytest.raises(KeyboardInterrupt), service_session(app_engine, _service(t)) as s:
        record(s)
    assert _counts(admin_engine, t) == counts
    monkeypatch.setattr(job, "record_derivation", real)
    with service_session(app_engine, _service(t)) as s:
        done = record(s)
        sources = s.execute(select(Decision.source_id)).scalars().all()
    assert (done.recorded, done.links) == (4, 4)
    assert len(sources) == len(set(sources)) == 4


def test_cli_remember_decision_then_derive(cli_env: dict[str, str],  # noqa: F811
                                           app_engine: Engine, tenant: TenantFixture) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    who = ["--tenant", tenant.org_id, "--user", "alice", "--scopes", "write:team"]
    said = CliRunner().invoke(app, ["remember", "We adopt trunk-based development.", "--decision",
                                    "--category", "process", *who], env=cli_env)
    assert said.exit_code == 0, said.output
    assert "as a decision in session cli (team)" in said.output
    first = CliRunner().invoke(app, ["derive", "decisions", *who], env=cli_env)
    assert first.exit_code == 0, first.output
    assert first.output.startswith("decisions: 1 recorded, 0 updated, 0 links, 0 problems")
    again = CliRunner().invoke(app, ["derive", "decisions", *who], env=cli_env)
    assert again.output.startswith("decisions: 0 recorded")
    with bound_session(app_engine, tenant.identity("bob", read=("team",))) as s:
        assert s.execute(select(Decision.category, Decision.decided_by)).one() == ("process", "alice")
