"""Lifecycle: policies per collection, sweep dry run and apply, pin, snooze, mark used, usage."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.db.derive_models import DocumentUse
from orchestrator.db.knowledge_models import UsageDaily, UsageEvent
from orchestrator.db.models import Document
from orchestrator.db.session import bound_session
from orchestrator.derive import lifecycle
from orchestrator.errors import BadInput, Forbidden, NotFound
from orchestrator.ingest.documents import DocumentInput, put_document
from tests.conftest import TenantFixture, TestDatabase
from tests.support.derive import cli_env  # noqa: F401

Tenants = Callable[..., TenantFixture]
LATER = timedelta(days=40)


def _put(app_engine: Engine, t: TenantFixture, path: str, *, collection: str = "notes",
         scopes: tuple[str, ...] = ("team",)) -> uuid.UUID:
    with bound_session(app_engine, t.identity(write=scopes)) as s:
        return put_document(s, DocumentInput(collection=collection, path=path, title=path,
                                             body=f"Body of {path}. " * 20, scopes=scopes)).document_id


def _archived(admin_engine: Engine, t: TenantFixture) -> set[str]:
    with admin_engine.connect() as conn:
        return set(conn.execute(text("select path from sources.documents where tenant_id = :t "
                                     "and archived_at is not null"), {"t": t.id}).scalars())


@pytest.fixture
def corpus(app_engine: Engine, tenant_factory: Tenants) -> tuple[TenantFixture, dict[str, uuid.UUID]]:
    t = tenant_factory("team", "exec")
    docs = {p: _put(app_engine, t, p) for p in ("a.md", "b.md", "pinned.md", "used.md")}
    docs["other.md"] = _put(app_engine, t, "other.md", collection="journal")
    docs["exec.md"] = _put(app_engine, t, "exec.md", scopes=("exec",))
    with bound_session(app_engine, t.identity(write=("team", "exec"))) as s:
        lifecycle.set_policy(s, "notes", 30)
        lifecycle.pin(s, docs["pinned.md"])
    return t, docs


def test_dry_run_lists_and_writes_nothing(app_engine: Engine, admin_engine: Engine,
                                          corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, _ = corpus
    ident = t.identity(write=("team", "exec"))
    with bound_session(app_engine, ident) as s:
        now_report = lifecycle.sweep(s)
        later = lifecycle.sweep(s, as_of=datetime.now(UTC) + LATER)
    assert now_report.items == ()  # nothing is 30 days old yet
    # journal has no policy; pinned.md is exempt.
    assert [it.path for it in later.items] == ["a.md", "b.md", "exec.md", "used.md"]
    assert not later.applied
    assert _archived(admin_engine, t) == set()


def test_apply_archives_exactly_the_listed_rows(app_engine: Engine, admin_engine: Engine,
                                                corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, _ = corpus
    ident = t.identity(write=("team", "exec"))
    moment = datetime.now(UTC) + LATER
    with bound_session(app_engine, ident) as s:
        dry = lifecycle.sweep(s, as_of=moment)
    with bound_session(app_engine, ident) as s:
        applied = lifecycle.sweep(s, as_of=moment, apply=True)
    assert applied.applied and applied.items == dry.items
    assert [it.path for it in dry.items] == ["a.md", "b.md", "exec.md", "used.md"]
    assert _archived(admin_engine, t) == {it.path for it in dry.items}
    assert "pinned.md" not in _archived(admin_engine, t)
    with bound_session(app_engine, ident) as s:
        again = lifecycle.sweep(s, as_of=moment, apply=True)
    assert again.items == ()  # archived rows are not swept twice


def test_mark_used_resets_the_clock_for_everyone(app_engine: Engine, admin_engine: Engine,
                                                 corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, docs = corpus
    with admin_engine.begin() as conn:  # the documents were last edited 50 days ago
        conn.execute(text("alter table sources.documents disable trigger tg_documents__normalize"))
        conn.execute(text("update sources.documents set updated_at = now() - interval '50 days' "
                          "where tenant_id = :t"), {"t": t.id})
        conn.execute(text("alter table sources.documents enable trigger tg_documents__normalize"))
    # bob only reads team; his use still counts for alice's sweep.
    with bound_session(app_engine, t.identity("bob", read=("team",))) as s:
        lifecycle.mark_used(s, docs["used.md"], channel="cli")
    with bound_session(app_engine, t.identity(write=("team", "exec"))) as s:
        report = lifecycle.sweep(s)
        uses = s.execute(select(DocumentUse.uses).where(DocumentUse.document_id == docs["used.md"])
                         ).scalar_one()
        ledger = s.execute(select(func.count()).select_from(UsageEvent)).scalar_one()
    assert [it.path for it in report.items] == ["a.md", "b.md", "exec.md"]
    assert uses == 1
    assert ledger == 0  # bob's ledger row is his alone; only the fold is shared


def test_sweep_respects_write_scopes_and_tenants(app_engine: Engine, admin_engine: Engine,
                                                 tenant_factory: Tenants,
                                                 corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, docs = corpus
    moment = datetime.now(UTC) + LATER
    # team writer who only reads exec: exec.md is neither listed nor archived.
    with bound_session(app_engine, t.identity(write=("team",), read=("exec",))) as s:
        report = lifecycle.sweep(s, as_of=moment, apply=True)
    assert [it.path for it in report.items] == ["a.md", "b.md", "used.md"]
    assert _archived(admin_engine, t) == {"a.md", "b.md", "used.md"}
    # A reader of team may not archive anything.
    with bound_session(app_engine, t.identity(read=("team", "exec"))) as s:
        assert lifecycle.sweep(s, as_of=moment).items == ()
    # Another tenant sees neither t's policies nor t's documents.
    other = tenant_factory("team")
    _put(app_engine, other, "a.md")
    with bound_session(app_engine, other.identity(write=("team",))) as s:
        assert lifecycle.policies(s) == []
        assert lifecycle.sweep(s, as_of=moment, apply=True).items == ()
        assert s.execute(select(func.count()).select_from(DocumentUse)).scalar_one() == 0
        with pytest.raises(NotFound):
            lifecycle.mark_used(s, docs["b.md"])


def test_document_use_hidden_without_read(app_engine: Engine,
                                          corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, docs = corpus
    with bound_session(app_engine, t.identity(read=("exec",))) as s:
        lifecycle.mark_used(s, docs["exec.md"])
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        assert s.execute(select(DocumentUse.document_id)).scalars().all() == []
    with bound_session(app_engine, t.identity(read=("exec",))) as s:
        assert s.execute(select(DocumentUse.document_id)).scalars().all() == [docs["exec.md"]]


def test_pin_and_snooze(app_engine: Engine, corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, docs = corpus
    with bound_session(app_engine, t.identity(write=("team",), read=("exec",))) as s:
        until = lifecycle.snooze(s, docs["a.md"], 3)
        with pytest.raises(Forbidden, match="not pin"):
            lifecycle.pin(s, docs["exec.md"])
        with pytest.raises(BadInput):
            lifecycle.snooze(s, docs["a.md"], -1)
    assert until > datetime.now(UTC) + timedelta(days=2.9)
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        visible = set(s.execute(text("select path from sources.current_documents")).scalars())
        assert "a.md" not in visible and "b.md" in visible
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        lifecycle.snooze(s, docs["a.md"], 0)
        lifecycle.pin(s, docs["pinned.md"], False)
        assert "a.md" in set(s.execute(text("select path from sources.current_documents")).scalars())
        assert not s.execute(select(Document.pinned).where(Document.id == docs["pinned.md"])).scalar_one()


def test_usage_aggregates_into_daily(app_engine: Engine,
                                     corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, docs = corpus
    for user in ("alice", "alice", "bob"):
        with bound_session(app_engine, t.identity(user, read=("team",))) as s:
            lifecycle.mark_used(s, docs["b.md"])
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        day = s.execute(select(func.current_date())).scalar_one()
        assert lifecycle.aggregate_usage(s, day) == 1
        assert lifecycle.aggregate_usage(s, day) == 1  # recomputed, not added
        row = s.execute(select(UsageDaily.operation, UsageDaily.channel, UsageDaily.operations,
                               UsageDaily.users)).one()
    assert tuple(row) == ("mark_used", "python", 3, 2)
    with pytest.raises(BadInput, match="unknown channel"), \
            bound_session(app_engine, t.identity(read=("team",))) as s:
        lifecycle.mark_used(s, docs["b.md"], channel="carrier-pigeon")


def test_policy_validation_and_removal(app_engine: Engine, tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        with pytest.raises(BadInput):
            lifecycle.set_policy(s, "notes", 0)
        lifecycle.set_policy(s, "notes", 10)
        lifecycle.set_policy(s, "notes", 20)
        assert lifecycle.policies(s) == [lifecycle.Policy("notes", 20)]
        assert lifecycle.remove_policy(s, "notes")
        assert not lifecycle.remove_policy(s, "notes")


def test_cli_sweep_dry_run_then_apply(cli_env: dict[str, str], admin_engine: Engine,  # noqa: F811
                                      corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, _ = corpus
    who = ["--tenant", t.org_id, "--scopes", "write:team"]
    as_of = (datetime.now(UTC) + LATER).isoformat()
    runner = CliRunner()
    dry = runner.invoke(app, ["lifecycle", "sweep", "--as-of", as_of, *who], env=cli_env)
    assert dry.exit_code == 0, dry.output
    assert "3 documents would archive (dry run" in dry.output
    assert dry.output.count("would archive\tnotes\t") == 3
    assert _archived(admin_engine, t) == set()
    done = runner.invoke(app, ["lifecycle", "sweep", "--apply", "--as-of", as_of, *who], env=cli_env)
    assert done.exit_code == 0, done.output
    assert "3 documents archived" in done.output
    assert _archived(admin_engine, t) == {"a.md", "b.md", "used.md"}
    bad = runner.invoke(app, ["lifecycle", "policy", "notes", *who], env=cli_env)
    assert bad.exit_code == 2 and "exactly one" in bad.output
    pol = runner.invoke(app, ["lifecycle", "policy", "journal", "--archive-after-days", "5", *who],
                        env=cli_env)
    assert pol.exit_code == 0 and "no document you can read" not in pol.output, pol.output
    # A policy over a collection nobody wrote into (a typo) is set, and said to hold nothing.
    typo = runner.invoke(app, ["lifecycle", "policy", "jornal", "--archive-after-days", "5", *who],
                         env=cli_env)
    assert typo.exit_code == 0
    assert "no document you can read is in collection 'jornal' yet: check the name" in typo.output
    listed = runner.invoke(app, ["lifecycle", "policies", *who], env=cli_env, terminal_width=200)
    assert listed.exit_code == 0, listed.output

    def rows(output: str) -> dict[str, list[str]]:
        return {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
                for line in output.splitlines() if line.count("│") == 4}

    # notes: a.md, b.md, used.md (archived) and pinned.md; exec.md is the exec scope's.
    assert rows(listed.output) == {"jornal": ["5", "0"], "journal": ["5", "1"],
                                   "notes": ["30", "4"]}, listed.output
    # The policies are the tenant's; the counts are what the caller can read.
    execs = runner.invoke(app, ["lifecycle", "policies", "--tenant", t.org_id, "--scopes",
                                "write:exec"], env=cli_env, terminal_width=200)
    assert rows(execs.output) == {"jornal": ["5", "0"], "journal": ["5", "0"],
                                  "notes": ["30", "1"]}, execs.output


def test_archive_and_unarchive_by_hand(app_engine: Engine, admin_engine: Engine,
                                       corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, docs = corpus
    with bound_session(app_engine, t.identity(write=("team",), read=("exec",))) as s:
        first = lifecycle.archive(s, docs["a.md"])
        assert lifecycle.archive(s, docs["a.md"]) == first  # archiving again keeps the first time
        with pytest.raises(Forbidden, match="not archive"):
            lifecycle.archive(s, docs["exec.md"])
        with pytest.raises(NotFound):
            lifecycle.archive(s, uuid.uuid4())
    assert first is not None and _archived(admin_engine, t) == {"a.md"}
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert lifecycle.archive(s, docs["a.md"], False) is None
    assert _archived(admin_engine, t) == set()


def test_sweep_items_carry_their_value(app_engine: Engine,
                                      corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, docs = corpus
    for user in ("alice", "bob"):
        with bound_session(app_engine, t.identity(user, read=("team",))) as s:
            lifecycle.mark_used(s, docs["b.md"], channel="cli")
    ident = t.identity(write=("team", "exec"))
    moment = datetime.now(UTC) + LATER
    with bound_session(app_engine, ident) as s:
        before = {it.path: (it.uses, it.days_used) for it in lifecycle.sweep(s, as_of=moment).items}
        assert lifecycle.refresh_value(s, datetime.now(UTC).date()) == 1
        after = {it.path: (it.uses, it.days_used) for it in lifecycle.sweep(s, as_of=moment).items}
        ranked = lifecycle.value(s, days=7)
        with pytest.raises(BadInput, match="days"):
            lifecycle.value(s, days=0)
    assert before["b.md"] == (0, 0)  # not aggregated yet
    assert after["b.md"] == (2, 1) and after["a.md"] == (0, 0)
    assert [(v.item_id, v.uses, v.marks) for v in ranked] == [(docs["b.md"], 2, 2)]


def test_killed_sweep_then_rerun_archives_exactly_once(
        test_db: TestDatabase, app_engine: Engine, admin_engine: Engine,
        corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    from tests.support.killed_run import kill_midway

    t, _ = corpus
    who = {"org": t.org_id, "user": "alice", "write": ["team", "exec"], "days": 40}
    killed = kill_midway(test_db.database.app_url(), who, "lifecycle", "sources.documents")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert _archived(admin_engine, t) == set()  # the archive statement ran, then the process died
    ident = t.identity(write=("team", "exec"))
    with bound_session(app_engine, ident) as s:
        done = lifecycle.sweep(s, as_of=datetime.now(UTC) + LATER, apply=True)
    assert [it.path for it in done.items] == ["a.md", "b.md", "exec.md", "used.md"]
    assert _archived(admin_engine, t) == {"a.md", "b.md", "exec.md", "used.md"}
    with bound_session(app_engine, ident) as s:
        assert lifecycle.sweep(s, as_of=datetime.now(UTC) + LATER, apply=True).items == ()


def test_cli_pin_snooze_archive_and_mark_used(cli_env: dict[str, str], app_engine: Engine,  # noqa: F811
                                              admin_engine: Engine,
                                              corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, docs = corpus
    writer = ["--tenant", t.org_id, "--scopes", "write:team"]
    reader = ["--tenant", t.org_id, "--user", "bob", "--scopes", "read:team"]
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(app, ["lifecycle", *args], env=cli_env)

    a = str(docs["a.md"])
    pinned = run("pin", a, *writer)
    assert pinned.exit_code == 0 and f"pinned {a}" in pinned.output, pinned.output
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        assert s.execute(select(Document.pinned).where(Document.id == docs["a.md"])).scalar_one()
    assert run("unpin", a, *writer).exit_code == 0
    snoozed = run("snooze", a, "--days", "2", *writer)
    assert snoozed.exit_code == 0 and "snoozed" in snoozed.output and "until" in snoozed.output
    assert "woke" in run("snooze", a, "--days", "0", *writer).output
    archived = run("archive", a, *writer)
    assert archived.exit_code == 0 and f"archived {a}" in archived.output
    assert _archived(admin_engine, t) == {"a.md"}
    assert run("unarchive", a, *writer).exit_code == 0 and _archived(admin_engine, t) == set()
    used = run("mark-used", a, *reader)
    assert used.exit_code == 0 and "marked" in used.output, used.output
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        assert s.execute(select(DocumentUse.uses).where(DocumentUse.document_id == docs["a.md"])
                         ).scalar_one() == 1
    # Clear errors, and nothing changed by them.
    not_an_id = run("pin", "a.md", *writer)
    assert not_an_id.exit_code == 2 and "not a document id" in not_an_id.output
    read_only = run("archive", a, *reader)
    assert read_only.exit_code == 1 and "not archive it" in read_only.output
    missing = run("pin", str(uuid.uuid4()), *writer)
    assert missing.exit_code == 1 and "no document" in missing.output
    negative = run("snooze", a, "--days", "-1", *writer)
    assert negative.exit_code == 2 and "between 0 and 36500" in negative.output
    hidden = run("pin", str(docs["exec.md"]), *writer)
    assert hidden.exit_code == 1 and "no document" in hidden.output  # exec is invisible to a team writer
    assert _archived(admin_engine, t) == set()
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        assert not s.execute(select(Document.pinned).where(Document.id == docs["a.md"])).scalar_one()
    no_identity = runner.invoke(app, ["lifecycle", "pin", a], env=cli_env)
    assert no_identity.exit_code == 2 and "no identity" in no_identity.output


def test_cli_value(cli_env: dict[str, str], app_engine: Engine,  # noqa: F811
                   corpus: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, docs = corpus
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        lifecycle.mark_used(s, docs["b.md"], channel="cli")
    who = ["--tenant", t.org_id, "--scopes", "read:team"]
    usage = CliRunner().invoke(app, ["derive", "usage", *who], env=cli_env)
    assert usage.exit_code == 0 and "1 value_daily rows changed" in usage.output, usage.output
    listed = CliRunner().invoke(app, ["lifecycle", "value", "--days", "7", *who], env=cli_env)
    assert listed.exit_code == 0, listed.output
    assert f"sources.documents\t{docs['b.md']}\t1 uses\t1 marked used\t1 days" in listed.output
    bad = CliRunner().invoke(app, ["lifecycle", "value", "--limit", "0", *who], env=cli_env)
    assert bad.exit_code == 2 and "limit" in bad.output
