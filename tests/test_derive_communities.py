"""Communities: Louvain over the relation graph, extractive summaries, incremental, per scope set."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, select, text

from orchestrator.config import Settings
from orchestrator.db.knowledge_models import Community
from orchestrator.db.session import bound_session
from orchestrator.derive.communities import rebuild
from orchestrator.derive.summarize import ended, summarize
from orchestrator.errors import BadInput
from orchestrator.ingest.knowledge import assert_relation, resolve_entity
from tests.conftest import TenantFixture, TestDatabase
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


def _ladder(extra: bool = False, prefix: str = "T") -> list[tuple[str, str, str]]:
    """Eight triangles; pairs of them joined by two edges, pairs of pairs by one: two Louvain passes."""
    edges = []
    for i in range(8):
        a, b, c = f"{prefix}{i}a", f"{prefix}{i}b", f"{prefix}{i}c"
        edges += [(a, b, f"{a} works beside {b} in cell {i}."),
                  (b, c, f"{b} hands parts to {c} in cell {i}."), (a, c, f"{a} trains {c} in cell {i}.")]
    for i in range(0, 8, 2):
        edges += [(f"{prefix}{i}a", f"{prefix}{i + 1}a", f"Cells {i} and {i + 1} share a bench."),
                  (f"{prefix}{i}b", f"{prefix}{i + 1}b", f"Cells {i} and {i + 1} share tools.")]
    for i in range(0, 8, 4):
        edges.append((f"{prefix}{i}c", f"{prefix}{i + 2}c", f"Cells {i} and {i + 2} meet on Fridays."))
    edges.append((f"{prefix}0b", f"{prefix}4b", f"The first and fifth cells of {prefix} swapped a lathe."))
    if extra:
        a, b, c, d = (f"{prefix}0{x}" for x in "abcd")
        edges += [(a, d, f"{d} joined cell 0 under {a}."), (b, d, f"{d} assists {b} in cell 0."),
                  (c, d, f"{d} and {c} share a shift in cell 0.")]
    return edges


def _events(admin_engine: Engine, t: TenantFixture) -> int:
    with admin_engine.connect() as conn:
        return int(conn.execute(text("select count(*) from provenance.events where tenant_id = :t"),
                                {"t": t.id}).scalar_one())


def test_levels_with_parents_summaries_and_per_level_incremental_counts(
        app_engine: Engine, admin_engine: Engine, tenant: TenantFixture) -> None:
    t = tenant
    ident = t.identity(write=("team",))
    ids = _relate(app_engine, t, _ladder())
    with bound_session(app_engine, ident) as s:
        first = rebuild(s)
    assert {lv: c.inserted for lv, c in first.levels.items()} == {0: 8, 1: 4}
    rows = _communities(app_engine, t, ("team",))
    by_id = {r.id: r for r in rows}
    cells = {frozenset(ids[f"T{i}{x}"] for x in "abc"): i for i in range(8)}
    level0 = [r for r in rows if r.level == 0]
    level1 = [r for r in rows if r.level == 1]
    assert {frozenset(r.member_entity_ids) for r in level0} == set(cells)
    for r in level0:  # each cell's parent is its pair, which contains it
        parent = by_id[r.parent_id]
        assert parent.level == 1 and set(r.member_entity_ids) <= set(parent.member_entity_ids)
        assert f"cell {cells[frozenset(r.member_entity_ids)]}" in r.summary
    assert all(r.parent_id is None and len(r.member_entity_ids) == 6 for r in level1)
    assert all(r.summary and r.input_digest is not None and r.embed_state == "pending" for r in rows)
    with admin_engine.connect() as conn:
        sources = conn.execute(text(
            "select source_table, count(*) from provenance.derivations where tenant_id = :t "
            "and derived_table = 'memory.communities' and derived_row_id->>'id' = :c group by 1"),
            {"t": t.id, "c": str(level1[0].id)}).all()
    # a pair's summary is derived from its two cells and the two claims joining them
    assert dict(sources) == {"memory.communities": 2, "knowledge.fact_claim": 2}

    events = _events(admin_engine, t)
    with bound_session(app_engine, ident) as s:
        again = rebuild(s)
    assert (again.inserted, again.updated, again.deleted, again.resummarised) == (0, 0, 0, 0)
    assert {lv: c.unchanged for lv, c in again.levels.items()} == {0: 8, 1: 4}
    assert _events(admin_engine, t) == events  # a rerun over unchanged input writes nothing

    # A new member of cell 0: that cell and its pair change, nothing else is re-summarised.
    ids |= _relate(app_engine, t, _ladder(extra=True)[-3:])
    with bound_session(app_engine, ident) as s:
        third = rebuild(s)
    counts = {lv: (c.updated, c.unchanged, c.resummarised, c.inserted, c.deleted)
              for lv, c in third.levels.items()}
    assert counts == {0: (1, 7, 1, 0, 0), 1: (1, 3, 1, 0, 0)}
    after = {r.id: r for r in _communities(app_engine, t, ("team",))}
    cell0 = next(r for r in level0 if ids["T0a"] in r.member_entity_ids)
    assert ids["T0d"] in after[cell0.id].member_entity_ids and after[cell0.id].parent_id == cell0.parent_id
    assert set(third.changed_ids) == {cell0.id, cell0.parent_id}
    untouched = [r for r in rows if r.id not in (cell0.id, cell0.parent_id)]
    assert all(after[r.id].built_at == r.built_at and after[r.id].summary == r.summary for r in untouched)


def test_a_changed_summary_input_is_resummarised_without_a_member_change(
        app_engine: Engine, tenant: TenantFixture) -> None:
    t = tenant
    ident = t.identity(write=("team",))
    _relate(app_engine, t, [("Ada", "Babbage", "Ada corresponded with Babbage."),
                            ("Babbage", "Engine", "Babbage designed the engine.")])
    with bound_session(app_engine, ident) as s:
        rebuild(s)
    # Same three members; a new claim between two of them is new input for the summary.
    _relate(app_engine, t, [("Ada", "Engine", "Ada programmed the engine.")])
    with bound_session(app_engine, ident) as s:
        changed = rebuild(s)
    assert (changed.updated, changed.resummarised, changed.inserted) == (1, 1, 0)
    (row,) = _communities(app_engine, t, ("team",))
    assert "programmed" in row.summary


def test_two_concurrent_runs_write_one_set_of_communities(app_engine: Engine, tenant: TenantFixture) -> None:
    from tests.support.derive import race

    t = tenant
    _relate(app_engine, t, _ladder())
    ident = t.identity(write=("team",))

    def run(progress: Callable[[int, int], None]) -> object:
        with bound_session(app_engine, ident) as s:
            return rebuild(s, on_progress=progress)

    reports = race(run)
    assert sorted(r.inserted for r in reports) == [0, 12]  # type: ignore[attr-defined]
    rows = _communities(app_engine, t, ("team",))
    assert len(rows) == 12 and len({(r.level, frozenset(r.member_entity_ids)) for r in rows}) == 12


def test_killed_run_then_rerun_completes_without_duplicates(
        test_db: TestDatabase, app_engine: Engine, admin_engine: Engine, tenant: TenantFixture) -> None:
    from tests.support.killed_run import kill_midway

    t = tenant
    _relate(app_engine, t, _ladder())
    who = {"org": t.org_id, "user": "alice", "write": ["team"]}
    killed = kill_midway(test_db.database.app_url(), who, "communities", "memory.communities", after=3)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert _communities(app_engine, t, ("team",)) == []  # the server rolled the killed run back
    with admin_engine.connect() as conn:
        assert conn.execute(text("select count(*) from provenance.derivations where tenant_id = :t"),
                            {"t": t.id}).scalar_one() == 0
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        resumed = rebuild(s)
    assert resumed.inserted == 12
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert rebuild(s).inserted == 0
    assert len(_communities(app_engine, t, ("team",))) == 12


def test_bad_max_levels_is_refused(app_engine: Engine, tenant: TenantFixture, settings: Settings) -> None:
    with bound_session(app_engine, tenant.identity(write=("team",))) as s, \
            pytest.raises(BadInput, match="ENGRAM_DERIVE_COMMUNITY_MAX_LEVELS"):
        rebuild(s, settings=settings.model_copy(update={"derive_community_max_levels": 0}))


def test_max_levels_caps_the_hierarchy(app_engine: Engine, tenant: TenantFixture, settings: Settings) -> None:
    _relate(app_engine, tenant, _ladder())
    with bound_session(app_engine, tenant.identity(write=("team",))) as s:
        capped = rebuild(s, settings=settings.model_copy(update={"derive_community_max_levels": 1}))
    assert set(capped.levels) == {0} and capped.inserted == 8
    assert all(r.parent_id is None for r in _communities(app_engine, tenant, ("team",)))


def test_full_rebuild_replaces_every_community(app_engine: Engine, tenant: TenantFixture) -> None:
    _relate(app_engine, tenant, _ladder())
    ident = tenant.identity(write=("team",))
    with bound_session(app_engine, ident) as s:
        rebuild(s)
    before = {(r.level, frozenset(r.member_entity_ids)): r
              for r in _communities(app_engine, tenant, ("team",))}
    with bound_session(app_engine, ident) as s:
        full = rebuild(s, full=True)
    assert (full.inserted, full.deleted, full.updated, full.resummarised) == (12, 12, 0, 12)
    after = {(r.level, frozenset(r.member_entity_ids)): r
             for r in _communities(app_engine, tenant, ("team",))}
    assert set(after) == set(before)  # same graph, same seed: the same hierarchy, under new ids
    assert not {r.id for r in after.values()} & {r.id for r in before.values()}
    assert all(after[k].summary == before[k].summary for k in after)
    ids = {r.id for r in after.values()}
    assert all(r.parent_id is None or r.parent_id in ids for r in after.values())


def test_a_change_in_one_component_leaves_the_others_exactly_as_they_were(
        app_engine: Engine, tenant: TenantFixture) -> None:
    ident = tenant.identity(write=("team",))
    _relate(app_engine, tenant, _ladder(prefix="A") + _ladder(prefix="B"))
    with bound_session(app_engine, ident) as s:
        first = rebuild(s)
    assert {lv: c.inserted for lv, c in first.levels.items()} == {0: 16, 1: 8}
    before = {r.id: r for r in _communities(app_engine, tenant, ("team",))}
    _relate(app_engine, tenant, _ladder(extra=True, prefix="A")[-3:])
    with bound_session(app_engine, ident) as s:
        second = rebuild(s)
    counts = {lv: (c.updated, c.unchanged, c.resummarised) for lv, c in second.levels.items()}
    assert counts == {0: (1, 15, 1), 1: (1, 7, 1)}
    after = {r.id: r for r in _communities(app_engine, tenant, ("team",))}
    assert set(after) == set(before)
    changed = {i for i in after if after[i].built_at != before[i].built_at}
    assert changed == set(second.changed_ids) and len(changed) == 2


def test_summary_sentences_end_before_the_next_begins() -> None:
    """A list item or heading picked as a sentence ends with a full stop in the summary, so it
    never runs into the next one ("... Lena, Marco Priya: staging ..." was a profile's text)."""
    sentences = ["Attendees: Tomás (chair), Priya, Lena, Marco",
                 "Priya: staging deployment by week 45",
                 "Priya wants a design doc first.", "Decisions:", 'She said "yes!"']
    summary = summarize(sentences, max_sentences=5)
    assert "Marco." in summary and "week 45." in summary and "Decisions." in summary
    assert "first.." not in summary and 'yes!".' not in summary and '"yes!"' in summary
    assert ended("(see the runbook)") == "(see the runbook)."
    assert ended("Really?)") == "Really?)" and ended("") == ""
    # Markdown emphasis closing an ended sentence is not text after it.
    assert ended("*Really?*") == "*Really?*" and ended("**Done.**") == "**Done.**"
    assert ended("a **bold** claim") == "a **bold** claim."


def test_a_community_is_summarised_from_its_claims_prose(app_engine: Engine,
                                                          tenant: TenantFixture) -> None:
    """undici's reference: a community's summary was a property list's line ("socketPath
    `string | null` (optional) - Default: `null` - An IPC endpoint ..."). Its claims' prose
    sentences come first (``quality.plausible_statement``), as RAPTOR's leaves do; a community
    with no prose keeps what it has."""
    t = tenant
    ident = t.identity(write=("team",))
    code = "socketPathOption `string | null` (optional) - Default: `null` - IPC endpointPath."
    _relate(app_engine, t, [("Ada", "Babbage", code),
                            ("Babbage", "Engine", "Babbage designed the engine in London."),
                            ("Quill", "Stream", code.replace("IPC", "RPC"))])
    with bound_session(app_engine, ident) as s:
        rebuild(s)
    summaries = sorted(c.summary for c in _communities(app_engine, t, ("team",)))
    prose = next(x for x in summaries if "designed the engine" in x)
    assert "socketPathOption" not in prose, summaries
    assert any("RPC" in x for x in summaries), "a community of code only keeps its sentences"
