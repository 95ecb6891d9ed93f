"""Extraction on ingest with the packaged spaCy model: entities, low-confidence claims, lineage."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, func, select, text

from orchestrator.db.derive_models import Extraction
from orchestrator.db.knowledge_models import Entity, FactClaim
from orchestrator.db.session import bound_session
from orchestrator.derive.extract import EXTRACTED_CONFIDENCE, extract
from orchestrator.ingest.documents import DocumentInput, put_document
from orchestrator.ingest.knowledge import resolve_entity
from tests.conftest import TenantFixture
from tests.support.derive import cli_env  # noqa: F401

Tenants = Callable[..., TenantFixture]

TEAM_TEXT = ("Ada Lovelace worked with Charles Babbage in London on 5 June 1843. "
             "Microsoft later named a language after Ada Lovelace.")
EXEC_TEXT = "Grace Hopper joined the Navy in Washington in 1943."


def _put(app_engine: Engine, t: TenantFixture, path: str, body: str, scopes: tuple[str, ...]) -> uuid.UUID:
    with bound_session(app_engine, t.identity(write=scopes)) as s:
        return put_document(s, DocumentInput(collection="notes", path=path, title=path, body=body,
                                             scopes=scopes)).document_id


def _counts(admin_engine: Engine, t: TenantFixture) -> tuple[int, int, int]:
    with admin_engine.connect() as conn:
        return tuple(int(conn.execute(text(f"select count(*) from {table} where tenant_id = :t"),  # type: ignore[return-value]
                                      {"t": t.id}).scalar_one())
                     for table in ("knowledge.entities", "knowledge.fact_claim", "provenance.derivations"))


@pytest.fixture
def tenant(tenant_factory: Tenants) -> TenantFixture:
    return tenant_factory("team", "exec")


def test_entities_claims_and_links_to_existing(app_engine: Engine, admin_engine: Engine,
                                               tenant: TenantFixture) -> None:
    t = tenant
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        # An entity someone already made, under an alias the text does not use.
        known = resolve_entity(s, "organization", "Microsoft Corporation", ("team",))
        s.execute(text("update knowledge.entities set aliases = array['Microsoft'] where id = :i"),
                  {"i": known})
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        report = extract(s)
        entities = {(e.entity_type, e.canonical_name): e.id for e in s.execute(select(Entity)).scalars()}
        claims = s.execute(select(FactClaim)).scalars().all()
    assert report.chunks == 1 and not report.quarantined
    assert {("person", "Ada Lovelace"), ("person", "Charles Babbage"), ("place", "London")} <= set(entities)
    # linked through resolution, not duplicated
    assert [n for (k, n) in entities if k == "organization"] == ["Microsoft Corporation"]
    assert known in report.entities
    by = {(c.subject_id, c.predicate, c.object_value, c.object_id) for c in claims}
    ada, babbage = entities[("person", "Ada Lovelace")], entities[("person", "Charles Babbage")]
    assert (ada, "mentioned_in", "notes/ada.md", None) in by
    assert (ada, "mentioned_on", "5 June 1843", None) in by
    pair = tuple(sorted((ada, babbage)))
    assert (pair[0], "co_mentioned_with", None, pair[1]) in by
    assert all(c.confidence == EXTRACTED_CONFIDENCE and c.author_role == "extractor" for c in claims)
    assert len([c for c in claims if c.subject_id == ada and c.predicate == "mentioned_in"]) == 1
    # lineage: each claim derived from its chunk
    with admin_engine.connect() as conn:
        sources = conn.execute(text(
            "select distinct source_table from provenance.derivations where tenant_id = :t "
            "and derived_table = 'knowledge.fact_claim'"), {"t": t.id}).scalars().all()
        derived = conn.execute(text(
            "select count(*) from provenance.derivations where tenant_id = :t "
            "and derived_table = 'knowledge.fact_claim'"), {"t": t.id}).scalar_one()
    assert sources == ["sources.chunks"] and derived == len(claims)


def test_running_twice_changes_nothing_and_edits_reextract(app_engine: Engine, admin_engine: Engine,
                                                           tenant: TenantFixture) -> None:
    t = tenant
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        first = extract(s)
    after_first = _counts(admin_engine, t)
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        second = extract(s)
    assert second.chunks == 0 and second.claims == []
    assert _counts(admin_engine, t) == after_first
    assert first.chunks == 1 and len(first.claims) >= 4
    _put(app_engine, t, "ada.md", TEAM_TEXT + " Alan Turing read her notes.", ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        third = extract(s)
        names = set(s.execute(select(Entity.canonical_name)).scalars())
        record = s.execute(select(Extraction.claim_ids)).scalars().all()
    assert third.chunks == 1 and "Alan Turing" in names
    assert len(record) == 1 and set(record[0]) == set(third.claims)


def test_outputs_keep_the_chunk_scopes(app_engine: Engine, tenant: TenantFixture,
                                       tenant_factory: Tenants) -> None:
    t = tenant
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    _put(app_engine, t, "grace.md", EXEC_TEXT, ("exec",))
    # A team-only writer extracts only what it may write: the exec chunk stays unread.
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert extract(s).chunks == 1
    with bound_session(app_engine, t.identity(write=("team", "exec"))) as s:
        assert extract(s).chunks == 1
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        team_names = set(s.execute(select(Entity.canonical_name)).scalars())
        team_claims = s.execute(select(func.count()).select_from(FactClaim)
                                .where(FactClaim.scopes != [t.scopes["team"]])).scalar_one()
    assert "Grace Hopper" not in team_names and "Ada Lovelace" in team_names
    assert team_claims == 0
    with bound_session(app_engine, t.identity(read=("exec",))) as s:
        assert "Grace Hopper" in set(s.execute(select(Entity.canonical_name)).scalars())
        assert s.execute(select(func.count()).select_from(Extraction)).scalar_one() == 1
    other = tenant_factory("team")
    with bound_session(app_engine, other.identity(write=("team",))) as s:
        assert extract(s).chunks == 0
        assert s.execute(select(func.count()).select_from(Entity)).scalar_one() == 0


def test_extracted_claims_go_through_shapes(app_engine: Engine, admin_engine: Engine,
                                            tenant: TenantFixture) -> None:
    t = tenant
    with admin_engine.begin() as conn:  # a DBA shape: mentions of dates must be ISO dates
        conn.execute(text("insert into knowledge.shapes (tenant_id, predicate, datatype) "
                          "values (:t, 'mentioned_on', 'date')"), {"t": t.id})
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        report = extract(s)
        held = s.execute(select(Extraction.quarantine_ids)).scalar_one()
        landed = s.execute(select(func.count()).select_from(FactClaim)
                           .where(FactClaim.predicate == "mentioned_on")).scalar_one()
    assert report.quarantined and set(held) == set(report.quarantined)
    assert landed == 0
    assert report.claims  # the other claims still landed


def test_cli_extract(admin_engine: Engine, app_engine: Engine, tenant: TenantFixture,
                     cli_env: dict[str, str]) -> None:  # noqa: F811
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    _put(app_engine, tenant, "ada.md", TEAM_TEXT, ("team",))
    who = ["--tenant", tenant.org_id, "--scopes", "write:team"]
    first = CliRunner().invoke(app, ["derive", "extract", *who], env=cli_env)
    assert first.exit_code == 0, first.output
    assert first.output.startswith("1 chunks read:")
    again = CliRunner().invoke(app, ["derive", "extract", *who], env=cli_env)
    assert again.output.startswith("0 chunks read: 0 entities, 0 claims")


def test_killed_mid_run_then_restarted_has_no_duplicates(app_engine: Engine, admin_engine: Engine,
                                                         tenant: TenantFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.derive.extract as job
    from orchestrator.audit.lineage import record_derivation as real

    t = tenant
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    _put(app_engine, t, "grace.md", EXEC_TEXT, ("team",))
    calls = [0]

    def crash_on_third(*args: object, **kw: object) -> object:
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt("killed")  # the process dies mid-run
        return real(*args, **kw)  # type: ignore[arg-type]  # passed through unchanged

    before = _counts(admin_engine, t)
    monkeypatch.setattr(job, "record_derivation", crash_on_third)
    with pytest.raises(KeyboardInterrupt), bound_session(app_engine, t.identity(write=("team",))) as s:
        extract(s)
    assert _counts(admin_engine, t) == before  # the run's one transaction rolled back
    monkeypatch.setattr(job, "record_derivation", real)
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        done = extract(s)
        mentions = s.execute(select(FactClaim.subject_id).where(FactClaim.predicate == "mentioned_in")
                             ).scalars().all()
    assert done.chunks == 2
    assert len(mentions) == len(set(mentions))  # one mention claim per entity and chunk
