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
