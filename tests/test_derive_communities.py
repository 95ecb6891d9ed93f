"""Communities: Louvain over the relation graph, extractive summaries, incremental, per scope set."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, select, text

from orchestrator.db.knowledge_models import Community
from orchestrator.db.session import bound_session
from orchestrator.derive.communities import rebuild
from orchestrator.derive.summarize import summarize
from orchestrator.ingest.knowledge import assert_relation, resolve_entity
from tests.conftest import TenantFixture
from tests.support.derive import cli_env  # noqa: F401

Tenants = Callable[..., TenantFixture]


def _relate(app_engine: Engine, t: TenantFixture, edges: list[tuple[str, str, str]],
            scopes: tuple[str, ...] = ("team",), entity_scopes: tuple[str, ...] = ("team",)
            ) -> dict[str, uuid.UUID]:
    ids: dict[str, uuid.UUID] = {}
    with bound_session(app_engine, t.identity(write=tuple(set(scopes) | set(entity_scopes)))) as s:
        for a, b, sentence in edges:
            for name in (a, b):
                if name not in ids:
                    found = resolve_entity(s, "thing", name, entity_scopes)
                    assert found is not None
                    ids[name] = found
            result = assert_relation(s, ids[a], "related_to", ids[b], sentence, scopes)
            assert result.claim_id is not None
    return ids


def _communities(app_engine: Engine, t: TenantFixture, read: tuple[str, ...]) -> list[Community]:
    with bound_session(app_engine, t.identity(read=read)) as s:
        return list(s.execute(select(Community).order_by(Community.id)).scalars())


@pytest.fixture
def tenant(tenant_factory: Tenants) -> TenantFixture:
    return tenant_factory("team", "exec")


def test_clusters_summaries_and_incremental_updates(app_engine: Engine, admin_engine: Engine,
                                                    tenant: TenantFixture) -> None:
    t = tenant
    ids = _relate(app_engine, t, [
        ("Ada", "Babbage", "Ada corresponded with Babbage about the engine."),
        ("Babbage", "Engine", "Babbage designed the analytical engine."),
        ("Ada", "Engine", "Ada wrote the first program for the engine."),
        ("Tea", "Milk", "Tea is often served with milk."),
        ("Milk", "Sugar", "Milk and sugar sit on the tray."),
        ("Tea", "Sugar", "Some take sugar in their tea."),
    ])
    ident = t.identity(write=("team",))
    with bound_session(app_engine, ident) as s:
        first = rebuild(s)
    assert (first.inserted, first.updated, first.deleted, first.unchanged) == (2, 0, 0, 0)
    rows = _communities(app_engine, t, ("team",))
    by_members = {frozenset(r.member_entity_ids): r for r in rows}
    engine_group = frozenset({ids["Ada"], ids["Babbage"], ids["Engine"]})
    tea_group = frozenset({ids["Tea"], ids["Milk"], ids["Sugar"]})
    assert set(by_members) == {engine_group, tea_group}
    engine_summary = by_members[engine_group].summary
    assert "engine" in engine_summary and "tea" not in engine_summary.lower()
    assert all(r.scopes == [t.scopes["team"]] for r in rows)

    with bound_session(app_engine, ident) as s:
        again = rebuild(s)
    assert (again.inserted, again.updated, again.deleted, again.unchanged) == (0, 0, 0, 2)

    ids |= _relate(app_engine, t, [("Honey", "Tea", "Honey sweetens tea."),
                                   ("Honey", "Milk", "Honey dissolves in warm milk.")])
    with bound_session(app_engine, ident) as s:
        third = rebuild(s)
    assert (third.inserted, third.updated, third.deleted, third.unchanged) == (0, 1, 0, 1)
    after = {r.id: r for r in _communities(app_engine, t, ("team",))}
    engine_row, tea_row = by_members[engine_group], by_members[tea_group]
    # the untouched community was not rewritten at all; the changed one kept its id
    assert after[engine_row.id].built_at == engine_row.built_at
    assert after[engine_row.id].summary == engine_row.summary
    assert set(after[tea_row.id].member_entity_ids) == tea_group | {ids["Honey"]}
    assert third.changed_ids == [tea_row.id]
    with admin_engine.connect() as conn:
        derived = conn.execute(text(
            "select count(*) from provenance.derivations where tenant_id = :t "
            "and derived_table = 'memory.communities' and source_table = 'knowledge.fact_claim'"),
            {"t": t.id}).scalar_one()
    assert derived == 3 + 3 + 5  # first build (3 + 3 claims), then the tea group again (5)


def test_summaries_are_built_per_scope_set(app_engine: Engine, tenant: TenantFixture,
                                           tenant_factory: Tenants) -> None:
    t = tenant
    both = ("team", "exec")
    _relate(app_engine, t, [("Alpha", "Beta", "Alpha partners with Beta on logistics."),
                            ("Beta", "Delta", "Beta ships through Delta.")],
            scopes=("team",), entity_scopes=both)
    _relate(app_engine, t, [("Alpha", "Gamma", "Alpha secretly plans to acquire Gamma."),
                            ("Gamma", "Beta", "Gamma undercuts Beta secretly.")],
            scopes=("exec",), entity_scopes=both)
    # A team-only writer rebuilds only the team scope set.
    with bound_session(app_engine, t.identity(write=("team",), read=("exec",))) as s:
        partial = rebuild(s)
    assert partial.scope_sets == 1 and partial.inserted == 1
    with bound_session(app_engine, t.identity(write=both)) as s:
        full = rebuild(s)
    assert (full.inserted, full.unchanged) == (1, 1)
    team = _communities(app_engine, t, ("team",))
    exec_ = _communities(app_engine, t, ("exec",))
    assert len(team) == 1 and len(exec_) == 1
    assert team[0].scopes == [t.scopes["team"]] and "secretly" not in team[0].summary
    assert exec_[0].scopes == [t.scopes["exec"]] and "secretly" in exec_[0].summary
    other = tenant_factory("team")
    with bound_session(app_engine, other.identity(write=("team",))) as s:
        nothing = rebuild(s)
    assert (nothing.inserted, nothing.scope_sets) == (0, 0)
    assert _communities(app_engine, other, ("team",)) == []


def test_summary_is_extractive_and_diverse() -> None:
    sentences = ["The engine computes numbers.", "The engine computes numbers quickly.",
                 "Ada wrote notes on the engine.", "Babbage built a difference engine."]
    summary = summarize(sentences, max_sentences=2)
    picked = [s for s in sentences if s in summary]
    assert len(picked) == 2  # whole input sentences, nothing invented
    # MMR: the two near-duplicates are never both chosen
    assert not {"The engine computes numbers.", "The engine computes numbers quickly."} <= set(picked)
    assert summarize(sentences, max_sentences=2) == summary
    assert summarize([]) == ""


def test_cli_communities(app_engine: Engine, tenant: TenantFixture,
                         cli_env: dict[str, str]) -> None:  # noqa: F811
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    _relate(app_engine, tenant, [("Ada", "Babbage", "Ada met Babbage.")])
    who = ["--tenant", tenant.org_id, "--scopes", "write:team"]
    first = CliRunner().invoke(app, ["derive", "communities", *who], env=cli_env)
    assert first.exit_code == 0, first.output
    assert "1 scope sets: 1 inserted, 0 updated, 0 deleted, 0 unchanged" in first.output
    again = CliRunner().invoke(app, ["derive", "communities", *who], env=cli_env)
    assert "0 inserted, 0 updated, 0 deleted, 1 unchanged" in again.output
