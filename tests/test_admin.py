"""DBA tasks refuse bad tenants and scopes in words a DBA can act on, and change nothing.

The database's own checks (migration 0001) stay the last word; these tests hold the words
said before them: which value, what it may be, and "already exists" for a second tenant or
scope of the same name instead of a duplicate-key refusal.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from orchestrator.admin import create_scope, create_tenant
from orchestrator.errors import BadInput, Conflict
from tests.conftest import TestDatabase


def _rows(admin_engine: Engine, org: str) -> list[tuple[str, str, str]]:
    with admin_engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "select t.name, s.name, s.description from auth.tenants t "
            "left join auth.scopes s on s.tenant_id = t.id where t.org_id = :o order by s.name"),
            {"o": org})]


def test_a_bad_tenant_is_refused_by_what_is_wrong(test_db: TestDatabase,
                                                   admin_engine: Engine) -> None:
    db = test_db.database
    cases = {
        "": "organization id must be 1 to 200 characters (got 0)",
        "o" * 201: "organization id must be 1 to 200 characters (got 201)",
        " acme": "organization id ' acme' begins or ends with a space",
        "a\x1bb": "organization id contains a control character (U+001B)",
        "a\nb": "organization id contains a control character (U+000A)",
    }
    for org, words in cases.items():
        with pytest.raises(BadInput) as refused:
            create_tenant(db, org, "Name")
        assert str(refused.value) == words
        assert _rows(admin_engine, org) == []
    org = f"adm-{uuid.uuid4().hex[:8]}"
    with pytest.raises(BadInput, match=r"^tenant name must be 1 to 200 characters \(got 0\)$"):
        create_tenant(db, org, "")
    with pytest.raises(BadInput, match=r"tenant name contains a control character \(U\+0009\)"):
        create_tenant(db, org, "a\tb")
    assert _rows(admin_engine, org) == []


def test_a_second_tenant_or_scope_of_a_name_is_a_conflict_that_keeps_the_first(
        test_db: TestDatabase, admin_engine: Engine) -> None:
    db = test_db.database
    org = f"adm-{uuid.uuid4().hex[:8]}"
    create_tenant(db, org, "First")
    create_scope(db, org, "team", "Everyone")
    with pytest.raises(Conflict) as again:
        create_tenant(db, org, "Second")
    assert str(again.value) == f"a tenant for organization {org!r} already exists"
    with pytest.raises(Conflict) as scope_again:
        create_scope(db, org, "team", "Someone else")
    assert str(scope_again.value) == f"scope 'team' already exists in organization {org!r}"
    assert _rows(admin_engine, org) == [("First", "team", "Everyone")]


def test_a_bad_scope_is_refused_by_what_is_wrong(test_db: TestDatabase,
                                                  admin_engine: Engine) -> None:
    db = test_db.database
    org = f"adm-{uuid.uuid4().hex[:8]}"
    create_tenant(db, org, org)
    rule = ("must be 1 to 63 characters of a-z, 0-9, '.', '_', ':' and '-', beginning with a "
            "letter or digit")
    for name in ("", "Has Space", "-lead", "x" * 64, "caf\u00e9"):
        with pytest.raises(BadInput) as refused:
            create_scope(db, org, name, "")
        assert str(refused.value).startswith("scope name ") and str(refused.value).endswith(rule)
    with pytest.raises(BadInput, match=r"^scope description must be 1 to 2,000 characters "
                                       r"\(got 2,001\)$"):
        create_scope(db, org, "team", "d" * 2001)
    with pytest.raises(BadInput, match=r"scope description contains a control character"):
        create_scope(db, org, "team", "bell\x07")
    assert _rows(admin_engine, org) == [(org, None, None)]
    # Prose may have lines, and a scope no description.
    create_scope(db, org, "team", "Everyone\nat the company")
    create_scope(db, org, "ops.on-call:eu_1", "")
    assert [r[1] for r in _rows(admin_engine, org)] == ["ops.on-call:eu_1", "team"]


def test_the_command_line_exits_2_for_bad_input_and_1_for_a_conflict(
        test_db: TestDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.cli.main as cli

    monkeypatch.setattr(cli, "_database", lambda: test_db.database)
    org = f"adm-{uuid.uuid4().hex[:8]}"
    runner = CliRunner()
    made = runner.invoke(cli.app, ["admin", "create-tenant", org])
    assert made.exit_code == 0 and f"tenant {org} created" in made.output
    bad = runner.invoke(cli.app, ["admin", "create-scope", org, "Team"])
    assert bad.exit_code == 2 and "error: scope name 'Team' must be" in bad.output
    twice = runner.invoke(cli.app, ["admin", "create-tenant", org])
    assert twice.exit_code == 1 and "already exists" in twice.output


def _write(app_engine: Engine, org: str, path: str, scopes: tuple[str, ...]) -> None:
    from orchestrator.auth import Identity
    from orchestrator.db.session import bound_session
    from orchestrator.ingest.documents import DocumentInput, put_document

    writer = Identity.of(org, "alice", read=list(scopes), write=list(scopes))
    with bound_session(app_engine, writer) as s:
        put_document(s, DocumentInput(collection="notes", path=path, title=path,
                                      body=f"# {path}\n\nWhat {path} says.", scopes=scopes))


def _paths(app_engine: Engine, org: str, scope: str) -> list[str]:
    from orchestrator.auth import Identity
    from orchestrator.db.session import bound_session

    with bound_session(app_engine, Identity.of(org, "reader", read=[scope])) as s:
        return sorted(s.execute(text("select path from sources.documents")).scalars())


def test_a_dba_lists_renames_and_describes_tenants_and_scopes(
        test_db: TestDatabase, app_engine: Engine) -> None:
    from orchestrator.admin import describe_scope, rename_scope, rename_tenant, scopes, tenants
    from orchestrator.errors import Forbidden, NotFound

    db = test_db.database
    org = f"adm-{uuid.uuid4().hex[:8]}"
    create_tenant(db, org, "Acme")
    create_scope(db, org, "team", "Everyone")
    create_scope(db, org, "hr", "")
    listed = {t.org_id: t for t in tenants(db)}
    assert (listed[org].name, listed[org].scopes) == ("Acme", 2)
    assert [(s.name, s.description) for s in scopes(db, org)] == [("hr", ""), ("team", "Everyone")]

    # A renamed scope keeps its rows: they name it by id; tokens name it anew.
    _write(app_engine, org, "pay.md", ("hr",))
    rename_scope(db, org, "hr", "people")
    describe_scope(db, org, "people", "Human resources\nand payroll")
    rename_tenant(db, org, "Acme Corp")
    assert [(s.name, s.description) for s in scopes(db, org)] == [
        ("people", "Human resources\nand payroll"), ("team", "Everyone")]
    assert {t.org_id: t.name for t in tenants(db)}[org] == "Acme Corp"
    assert _paths(app_engine, org, "people") == ["pay.md"]
    with pytest.raises(Forbidden, match=r"unknown scope\(s\) for tenant .*: hr"):
        _paths(app_engine, org, "hr")

    # Each refusal says what was wrong and changes nothing.
    with pytest.raises(Conflict, match=r"^scope 'team' already exists in organization "):
        rename_scope(db, org, "people", "team")
    with pytest.raises(BadInput, match=r"^scope name 'People' must be 1 to 63 characters"):
        rename_scope(db, org, "people", "People")
    with pytest.raises(NotFound, match=rf"^no scope 'hr' in organization '{org}'$"):
        describe_scope(db, org, "hr", "gone")
    with pytest.raises(NotFound, match=r"^no tenant for organization 'adm-nobody'$"):
        scopes(db, "adm-nobody")
    with pytest.raises(BadInput, match=r"^tenant name must be 1 to 200 characters \(got 0\)$"):
        rename_tenant(db, org, "")
    with pytest.raises(BadInput, match=r"scope description contains a control character"):
        describe_scope(db, org, "team", "bell\x07")
    assert [(s.name, s.description) for s in scopes(db, org)] == [
        ("people", "Human resources\nand payroll"), ("team", "Everyone")]
    assert {t.org_id: t.name for t in tenants(db)}[org] == "Acme Corp"


def test_a_scope_that_rows_are_shared_into_is_not_deleted(
        test_db: TestDatabase, app_engine: Engine) -> None:
    from orchestrator.admin import delete_scope, scopes

    db = test_db.database
    org = f"adm-{uuid.uuid4().hex[:8]}"
    create_tenant(db, org, org)
    for name in ("team", "exec", "spare"):
        create_scope(db, org, name)
    _write(app_engine, org, "plan.md", ("team",))
    _write(app_engine, org, "board.md", ("exec", "team"))
    for name in ("team", "exec"):
        with pytest.raises(Conflict) as refused:
            delete_scope(db, org, name)
        assert str(refused.value) == (
            f"scope '{name}' of organization '{org}' still holds rows (in sources.chunks, "
            "sources.documents): deleting it would leave them readable by no one; have their "
            "writers delete them or share them into another scope first")
    held = {s.name: s.holders for s in scopes(db, org)}
    assert held == {"exec": ("sources.chunks", "sources.documents"),
                    "spare": (), "team": ("sources.chunks", "sources.documents")}
    delete_scope(db, org, "spare")
    assert [s.name for s in scopes(db, org)] == ["exec", "team"]
    assert _paths(app_engine, org, "team") == ["board.md", "plan.md"]
    assert _paths(app_engine, org, "exec") == ["board.md"]


def test_the_listing_commands_and_a_refused_delete_on_the_command_line(
        test_db: TestDatabase, app_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.cli.main as cli

    monkeypatch.setattr(cli, "_database", lambda: test_db.database)
    org = f"adm-{uuid.uuid4().hex[:8]}"
    runner = CliRunner()
    assert runner.invoke(cli.app, ["admin", "create-tenant", org, "--name", "Listed"]).exit_code == 0
    empty = runner.invoke(cli.app, ["admin", "scopes", org])
    assert empty.exit_code == 0 and f"no scopes in {org} yet" in empty.output
    assert runner.invoke(cli.app, ["admin", "create-scope", org, "team"]).exit_code == 0
    _write(app_engine, org, "plan.md", ("team",))
    listed = runner.invoke(cli.app, ["admin", "tenants"], terminal_width=200)
    assert listed.exit_code == 0
    assert any(org in line and "Listed" in line and " 1 " in line for line in listed.output.splitlines())
    held = runner.invoke(cli.app, ["admin", "delete-scope", org, "team"])
    assert held.exit_code == 1 and "still holds rows (in sources.chunks, sources.documents)" in held.output
    unknown = runner.invoke(cli.app, ["admin", "scopes", "adm-nobody"])
    assert unknown.exit_code == 1 and "no tenant for organization 'adm-nobody'" in unknown.output
    renamed = runner.invoke(cli.app, ["admin", "rename-scope", org, "team", "crew"])
    assert renamed.exit_code == 0 and "a token that names team is refused" in renamed.output
    shown = runner.invoke(cli.app, ["admin", "scopes", org], terminal_width=200)
    assert shown.exit_code == 0 and "crew" in shown.output and "team" not in shown.output
    assert "sources.chunks, sources.documents" in shown.output
    assert runner.invoke(cli.app, ["admin", "create-scope", org, "spare"]).exit_code == 0
    spare = runner.invoke(cli.app, ["admin", "scopes", org], terminal_width=200)
    assert "none (delete-scope would delete it)" in spare.output, spare.output
