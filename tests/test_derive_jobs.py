"""The derive registry and scheduler: every job, every tenant, as the service identity."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from orchestrator.config import Settings
from orchestrator.db.knowledge_models import Episode, FactConflict, Observation
from orchestrator.db.session import bound_session
from orchestrator.derive.jobs import JOBS, DeriveScheduler, Job, JobResult, Outcome
from orchestrator.derive.service import SERVICE_USER, service_tenants
from orchestrator.errors import Forbidden
from orchestrator.ingest.documents import DocumentInput, put_document
from orchestrator.ingest.knowledge import FactInput, assert_fact, resolve_entity
from orchestrator.ingest.memory import add_working_memory
from tests.conftest import TenantFixture, TestDatabase
from tests.support.derive import cli_env
from tests.support.knowledge import define_shape
from tests.support.recall import embed_pending, embedder

__all__ = ["cli_env", "embedder"]

Tenants = Callable[..., TenantFixture]
BY_NAME = {j.name: j for j in JOBS}


@pytest.fixture(scope="module")
def worker_engine(test_db: TestDatabase) -> Iterator[Engine]:
    eng = test_db.engine(test_db.database.role_url("engram_worker"))
    yield eng
    eng.dispose()


def _fill(app_engine: Engine, t: TenantFixture, person: str) -> None:
    """A small corpus: a document, corroborating claims, a dialogue, a marked decision."""
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        put_document(s, DocumentInput(collection="notes", path="a.md", title="A",
                                      body=f"{person} met Grace Hopper in London.", scopes=("team",)))
        subject = resolve_entity(s, "person", person, ("team",))
        assert subject is not None
        assert_fact(s, FactInput(subject_id=subject, predicate="works_at", text=f"{person} works at Acme.",
                                 value="Acme", scopes=("team",), confidence=0.8))
        add_working_memory(s, "s1", "We will ship on Friday.", ("team",))
        add_working_memory(s, "s1", "Ship on Friday because the demo is Monday.", ("team",),
                           kind="decision", category="release")
    with bound_session(app_engine, t.identity("bob", write=("team",))) as s:
        assert_fact(s, FactInput(subject_id=subject, predicate="works_at", text=f"{person} is at Acme.",
                                 value="Acme", scopes=("team",), confidence=0.8))


def _events(admin_engine: Engine, t: TenantFixture) -> int:
    with admin_engine.connect() as conn:
        return int(conn.execute(text("select count(*) from provenance.events where tenant_id = :t"),
                                {"t": t.id}).scalar_one())


def test_the_scheduler_runs_every_job_for_every_tenant_as_the_service(
        test_db: TestDatabase, app_engine: Engine, admin_engine: Engine, worker_engine: Engine,
        settings: Settings, embedder: Any, tenant_factory: Tenants) -> None:
    tenants = [tenant_factory("team"), tenant_factory("team")]
    for t, person in zip(tenants, ("Ada Lovelace", "Alan Turing"), strict=True):
        _fill(app_engine, t, person)
        embed_pending(test_db, embedder, settings, t.id)  # what the worker does before RAPTOR sees it
    seen: list[JobResult] = []
    scheduler = DeriveScheduler(worker_engine, app_engine, settings, tenants=[t.id for t in tenants],
                                on_result=seen.append)
    report = scheduler.tick()
    assert report.tenants == 2 and report.failed == []
    assert [(r.tenant, r.job) for r in report.results] == [
        (t.org_id, j.name) for t in sorted(tenants, key=lambda t: t.id) for j in JOBS]
    assert seen == report.results
    assert scheduler.last_runs == {(r.tenant, r.job): r for r in report.results}
    assert scheduler.last_tick_at is not None
    by_job = {r.job: r for r in report.results if r.tenant == tenants[0].org_id}
    assert by_job["lifecycle"].line == "lifecycle: 0 documents archived"
    # one chunk and two embedded world facts: one scope set, one leaf that is the root
    assert by_job["raptor"].line.startswith("raptor: 1 scope sets, 1 inserted, 0 updated")
    assert by_job["extract"].line.startswith("1 chunks read:")
    assert by_job["consolidate"].line.startswith("observations: 1 inserted")
    assert by_job["episodes"].line.startswith("episodes: 1 inserted")
    assert by_job["decisions"].line.startswith("decisions: 1 recorded")
    for t in tenants:
        with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
            assert len(s.execute(select(Episode)).scalars().all()) == 1  # alice's own, private
            assert len(s.execute(select(Observation)).scalars().all()) == 1
        with admin_engine.connect() as conn:
            actors = set(conn.execute(text(
                "select distinct e.actor_user from provenance.events e where e.tenant_id = :t and "
                "e.table_name in ('memory.episodes', 'memory.observations', 'memory.decisions')"),
                {"t": t.id}).scalars())
            kinds = set(conn.execute(text(
                "select kind from provenance.activities where tenant_id = :t"), {"t": t.id}).scalars())
        assert actors == {SERVICE_USER}
        assert {"derive.extract", "derive.consolidate", "derive.episodes", "derive.decisions",
                "derive.raptor"} <= kinds


def test_a_second_tick_writes_nothing(test_db: TestDatabase, app_engine: Engine, admin_engine: Engine,
                                      worker_engine: Engine, settings: Settings, embedder: Any,
                                      tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    _fill(app_engine, t, "Ada Lovelace")
    embed_pending(test_db, embedder, settings, t.id)
    scheduler = DeriveScheduler(worker_engine, app_engine, settings, tenants=[t.id])
    first = {r.job: r for r in scheduler.tick().results}
    assert [r for r in first.values() if not r.ok] == []
    assert first["raptor"].line.startswith("raptor: 1 scope sets, 1 inserted")
    events = _events(admin_engine, t)
    again = scheduler.tick()
    assert again.failed == [] and _events(admin_engine, t) == events
    lines = {r.job: r.line for r in again.results}
    assert lines["conflicts"] == "0 new conflicts"
    assert lines["raptor"].startswith("raptor: 1 scope sets, 0 inserted, 0 updated, 0 deleted, 1 unchanged")


def test_conflicts_no_writer_could_see_are_found_and_reported(
        app_engine: Engine, worker_engine: Engine, settings: Settings, tenant_factory: Tenants,
        admin_engine: Engine) -> None:
    t = tenant_factory("team", "exec")
    define_shape(admin_engine, t.id, "ceo", max_count=1)
    with bound_session(app_engine, t.identity("alice", write=("team", "exec"))) as s:
        acme = resolve_entity(s, "organization", "Acme", ("team", "exec"))
    assert acme is not None
    for user, scope, value in (("alice", "team", "Ann"), ("bob", "exec", "Ben")):
        with bound_session(app_engine, t.identity(user, write=(scope,))) as s:
            assert_fact(s, FactInput(subject_id=acme, predicate="ceo", text=f"{value} is the CEO.",
                                     value=value, scopes=(scope,)))
    with bound_session(app_engine, t.identity("carol", read=("team", "exec"))) as s:
        assert s.execute(select(FactConflict)).scalars().all() == []  # neither writer saw the other
    conflicts = next(j for j in JOBS if j.name == "conflicts")
    scheduler = DeriveScheduler(worker_engine, app_engine, settings, jobs=[conflicts], tenants=[t.id])
    assert [r.line for r in scheduler.tick().results] == ["1 new conflicts"]
    assert [r.line for r in scheduler.tick().results] == ["0 new conflicts"]
    with bound_session(app_engine, t.identity("carol", read=("team", "exec"))) as s:
        assert len(s.execute(select(FactConflict)).scalars().all()) == 1


def test_one_failing_job_does_not_stop_the_others(app_engine: Engine, worker_engine: Engine,
                                                  settings: Settings, tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    _fill(app_engine, t, "Ada Lovelace")

    def boom(session: Session, settings: Settings) -> Outcome:
        session.execute(text("select 1 / 0"))
        return Outcome("unreachable")

    jobs = [Job("boom", "always fails", boom), BY_NAME["consolidate"], BY_NAME["episodes"]]
    report = DeriveScheduler(worker_engine, app_engine, settings, jobs=jobs, tenants=[t.id]).tick()
    assert [(r.job, r.ok) for r in report.results] == [("boom", False), ("consolidate", True),
                                                         ("episodes", True)]
    assert "division by zero" in report.results[0].line
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        assert len(s.execute(select(Episode)).scalars().all()) == 1


def test_the_loop_survives_failures_until_stopped(app_engine: Engine, worker_engine: Engine,
                                                  settings: Settings, tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    ticks: list[int] = []
    twice = threading.Event()

    def fails(session: Session, settings: Settings) -> Outcome:
        raise RuntimeError("broken job")

    def counts(session: Session, settings: Settings) -> Outcome:
        ticks.append(1)
        if len(ticks) >= 2:
            twice.set()
        return Outcome("counted")

    quick = settings.model_copy(update={"derive_interval_s": 0.05})
    scheduler = DeriveScheduler(worker_engine, app_engine, quick, tenants=[t.id],
                                jobs=[Job("fails", "", fails), Job("counts", "", counts)])
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run_forever, args=(stop,), daemon=True)
    thread.start()
    try:
        assert twice.wait(timeout=30), "the scheduler stopped ticking after a failing job"
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_only_the_worker_role_lists_tenants(app_engine: Engine, worker_engine: Engine,
                                            tenant_factory: Tenants) -> None:
    t = tenant_factory("team", "exec")
    with worker_engine.connect() as conn:
        (listed,) = service_tenants(conn, [t.id])
    assert (listed.id, listed.org_id, listed.scopes) == (t.id, t.org_id, ("exec", "team"))
    with app_engine.connect() as conn, pytest.raises(Forbidden):
        service_tenants(conn)


def test_cli_derive_all_and_worker_once(test_db: TestDatabase, app_engine: Engine,
                                        cli_env: dict[str, str],
                                        tenant_factory: Tenants) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    t = tenant_factory("team")
    _fill(app_engine, t, "Ada Lovelace")
    who = ["--tenant", t.org_id, "--user", "alice", "--scopes", "write:team"]
    result = CliRunner().invoke(app, ["derive", "all", *who], env=cli_env)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split(":")[0] for line in lines[:len(JOBS)]] == [j.name for j in JOBS]
    assert "decisions: 1 recorded, 0 updated, 0 links" in result.output
    assert lines[-1].startswith(f"{len(JOBS)} jobs in ")
    # The worker: drains, derives every job of this tenant as the service, drains again.
    other = tenant_factory("team")
    _fill(app_engine, other, "Alan Turing")
    run = CliRunner().invoke(app, ["worker", "run", "--once", "--derive", "--tenant", str(other.id)],
                             env=cli_env)
    assert run.exit_code == 0, run.output
    assert f"derive {other.org_id}: episodes: ok: episodes: 1 inserted" in run.output
    assert f"derived 1 tenant, {len(JOBS)} jobs in" in run.output
    with bound_session(app_engine, other.identity("alice", write=("team",))) as s:
        states = set(s.execute(select(Episode.embed_state)).scalars())
    assert states == {"ready"}  # the second drain embedded what the jobs wrote


def test_each_tick_compacts_the_bm25_statistics(app_engine: Engine, admin_engine: Engine,
                                                worker_engine: Engine, settings: Settings,
                                                tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    ident = t.identity("alice", write=("team",))
    for n in range(6):  # one statistic delta per written document
        with bound_session(app_engine, ident) as s:
            put_document(s, DocumentInput(collection="notes", path=f"{n}.md", title=f"N{n}",
                                          body=f"Note number {n} about compaction.", scopes=("team",)))

    def stats() -> tuple[int, int, int]:
        with admin_engine.connect() as conn:
            rows, chunks, tokens = conn.execute(text(
                "select count(*), sum(chunks), sum(tokens) from recall.lexical_stats where tenant_id = :t"),
                {"t": t.id}).one()
        return int(rows), int(chunks), int(tokens)

    rows, chunks, tokens = stats()
    assert rows >= 6
    scheduler = DeriveScheduler(worker_engine, app_engine,
                                settings.model_copy(update={"derive_compact_min_deltas": 3}),
                                jobs=[], tenants=[t.id])
    scheduler.tick()
    assert stats() == (1, chunks, tokens), "one row per scope set, the same N and total length"
    # The worker role itself may neither read nor change the statistics.
    with worker_engine.connect() as conn, pytest.raises(Exception, match="permission denied"):
        conn.execute(text("select count(*) from recall.lexical_stats"))


def _stale_documents(app_engine: Engine, admin_engine: Engine, t: TenantFixture) -> dict[str, uuid.UUID]:
    """Two notes and a pinned note, last edited 50 days ago, under a 30-day policy."""
    from orchestrator.derive import lifecycle

    ids = {}
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        for path in ("old.md", "older.md", "pinned.md"):
            ids[path] = put_document(s, DocumentInput(collection="notes", path=path, title=path,
                                                      body=f"Body of {path}.", scopes=("team",))).document_id
        lifecycle.set_policy(s, "notes", 30)
        lifecycle.pin(s, ids["pinned.md"])
    with admin_engine.begin() as conn:
        conn.execute(text("alter table sources.documents disable trigger tg_documents__normalize"))
        conn.execute(text("update sources.documents set updated_at = now() - interval '50 days' "
                          "where tenant_id = :t"), {"t": t.id})
        conn.execute(text("alter table sources.documents enable trigger tg_documents__normalize"))
    return ids


def _archived(admin_engine: Engine, t: TenantFixture) -> set[str]:
    with admin_engine.connect() as conn:
        return set(conn.execute(text("select path from sources.documents where tenant_id = :t "
                                     "and archived_at is not null"), {"t": t.id}).scalars())


def test_the_schedule_applies_lifecycle_policies_and_logs_what_it_archived(
        app_engine: Engine, admin_engine: Engine, worker_engine: Engine, settings: Settings,
        tenant_factory: Tenants, caplog: pytest.LogCaptureFixture) -> None:
    t = tenant_factory("team")
    ids = _stale_documents(app_engine, admin_engine, t)
    with bound_session(app_engine, t.identity("bob", read=("team",))) as s:
        from orchestrator.derive import lifecycle

        lifecycle.mark_used(s, ids["older.md"], channel="cli")  # a use of older.md, counted in its value ...
    with admin_engine.begin() as conn:  # ... but 45 days ago, so older than the policy too
        conn.execute(text("update memory.document_use set last_used_at = now() - interval '45 days' "
                          "where tenant_id = :t"), {"t": t.id})
    scheduler = DeriveScheduler(worker_engine, app_engine, settings, tenants=[t.id],
                                jobs=[BY_NAME["usage"], BY_NAME["lifecycle"]])
    with caplog.at_level(logging.INFO, logger="engram.derive.jobs"):
        report = scheduler.tick()
    assert [r.line for r in report.results][1] == "lifecycle: 2 documents archived"
    assert _archived(admin_engine, t) == {"old.md", "older.md"}  # pinned.md never
    logged = [r.getMessage() for r in caplog.records if "lifecycle: archived" in r.getMessage()]
    assert len(logged) == 2 and any(f"notes/older.md ({ids['older.md']})" in m and "1 uses on 1 days" in m
                                    for m in logged)
    with admin_engine.connect() as conn:
        kinds = conn.execute(text("select kind from provenance.activities a join provenance.events e "
                                  "on e.activity_id = a.id where e.tenant_id = :t "
                                  "and e.table_name = 'sources.documents' and e.operation = 'UPDATE'"),
                             {"t": t.id}).scalars().all()
    assert set(kinds) == {"derive.lifecycle"}
    assert [r.line for r in scheduler.tick().results][1] == "lifecycle: 0 documents archived"


def test_a_dry_run_setting_keeps_the_scheduled_sweep_to_a_list(
        app_engine: Engine, admin_engine: Engine, worker_engine: Engine, settings: Settings,
        tenant_factory: Tenants, caplog: pytest.LogCaptureFixture) -> None:
    t = tenant_factory("team")
    _stale_documents(app_engine, admin_engine, t)
    events = _events(admin_engine, t)
    dry = settings.model_copy(update={"derive_lifecycle_dry_run": True})
    scheduler = DeriveScheduler(worker_engine, app_engine, dry, tenants=[t.id], jobs=[BY_NAME["lifecycle"]])
    with caplog.at_level(logging.INFO, logger="engram.derive.jobs"):
        (result,) = scheduler.tick().results
    assert result.line == "lifecycle: 2 documents would archive (dry run: ENGRAM_DERIVE_LIFECYCLE_DRY_RUN)"
    assert sum("lifecycle: would archive notes/" in r.getMessage() for r in caplog.records) == 2
    assert _archived(admin_engine, t) == set() and _events(admin_engine, t) == events


def test_raptor_is_rebuilt_from_scratch_on_its_own_schedule(
        test_db: TestDatabase, app_engine: Engine, admin_engine: Engine, worker_engine: Engine,
        settings: Settings, embedder: Any, tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    _fill(app_engine, t, "Ada Lovelace")
    embed_pending(test_db, embedder, settings, t.id)
    raptor = [BY_NAME["raptor"]]
    hourly = DeriveScheduler(worker_engine, app_engine,
                             settings.model_copy(update={"derive_raptor_full_every_s": 3600}),
                             tenants=[t.id], jobs=raptor)
    assert hourly.tick().results[0].line.startswith("raptor (full rebuild): 1 scope sets, 1 inserted")
    # within the hour: incremental, and nothing to do
    assert hourly.tick().results[0].line.startswith("raptor: 1 scope sets, 0 inserted, 0 updated")
    with bound_session(app_engine, t.identity("alice", read=("team",))) as s:
        from orchestrator.derive.jobs import last_full_raptor

        last = last_full_raptor(s)
    assert last is not None and datetime.now(UTC) - last < timedelta(minutes=5)
    # a new scheduler (a restarted worker) reads the last full rebuild from the database
    again = DeriveScheduler(worker_engine, app_engine,
                            settings.model_copy(update={"derive_raptor_full_every_s": 3600}),
                            tenants=[t.id], jobs=raptor)
    assert again.tick().results[0].line.startswith("raptor: ")
    often = DeriveScheduler(worker_engine, app_engine,
                            settings.model_copy(update={"derive_raptor_full_every_s": 0.001}),
                            tenants=[t.id], jobs=raptor)
    rebuilt = often.tick().results[0].line
    assert rebuilt.startswith("raptor (full rebuild): 1 scope sets, 1 inserted, 0 updated, 1 deleted")
    never = DeriveScheduler(worker_engine, app_engine, settings, tenants=[t.id], jobs=raptor)
    assert never.tick().results[0].line.startswith("raptor: ")  # off by default


def test_the_usage_job_keeps_value_daily(app_engine: Engine, admin_engine: Engine, worker_engine: Engine,
                                         settings: Settings, tenant_factory: Tenants) -> None:
    from orchestrator.db.knowledge_models import ValueDaily
    from orchestrator.derive import lifecycle

    t = tenant_factory("team", "exec")
    with bound_session(app_engine, t.identity("alice", write=("team", "exec"))) as s:
        team_doc = put_document(s, DocumentInput(collection="notes", path="t.md", title="T", body="Team.",
                                                 scopes=("team",))).document_id
        exec_doc = put_document(s, DocumentInput(collection="notes", path="e.md", title="E", body="Exec.",
                                                 scopes=("exec",))).document_id
        for doc in (team_doc, team_doc, exec_doc):
            lifecycle.mark_used(s, doc, channel="cli")
    usage = DeriveScheduler(worker_engine, app_engine, settings, tenants=[t.id], jobs=[BY_NAME["usage"]])
    (first,) = usage.tick().results
    assert "value_daily: 2 rows changed" in first.line
    with bound_session(app_engine, t.identity("bob", read=("team",))) as s:
        rows = s.execute(select(ValueDaily.item_id, ValueDaily.uses, ValueDaily.marks)).all()
        ranked = lifecycle.value(s)
    assert rows == [(team_doc, 2, 2)]  # bob cannot read the exec document, nor its value
    assert [(v.item_id, v.uses, v.days) for v in ranked] == [(team_doc, 2, 1)]
    events = _events(admin_engine, t)
    (second,) = usage.tick().results
    assert "value_daily: 0 rows changed" in second.line and _events(admin_engine, t) == events


def test_the_cli_progress_bar_shows_only_on_a_terminal() -> None:
    import io

    from rich.console import Console

    from orchestrator.cli.progress import progress_bar

    shown = io.StringIO()
    with progress_bar(Console(file=shown, force_terminal=True, width=100), "communities") as bar:
        bar(3, 10)
        bar(10, 10, "profiles")
    assert "communities" in shown.getvalue() and "profiles" in shown.getvalue()
    assert "10/10" in shown.getvalue()
    piped = io.StringIO()
    with progress_bar(Console(file=piped, width=100), "communities") as bar:
        bar(1, 2, "raptor")
    assert piped.getvalue() == ""  # scripts and logs get the report lines alone
