"""Provenance over the knowledge tables: a fact claimed from a chunk, traced and exported.

Also the chain's concurrency promise seen from outside: an open writer holds no
chain lock; events are numbered in commit order.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from rdflib import Graph
from rdflib.namespace import PROV
from sqlalchemy import Engine, select, text

from orchestrator.audit.chain import verify
from orchestrator.audit.export import Names, export
from orchestrator.audit.lineage import begin_activity, end_activity, ensure_agent, lineage, record_derivation
from orchestrator.db.models import Chunk
from orchestrator.db.session import bound_session
from orchestrator.ingest.documents import put_document
from tests.conftest import TenantFixture
from tests.support.provenance import auditor_engine, doc, put

__all__ = ["auditor_engine"]

TenantMaker = Callable[..., TenantFixture]


@pytest.fixture
def knowledge(admin_engine: Engine) -> None:
    with admin_engine.connect() as conn:
        if conn.execute(text("select to_regclass('knowledge.fact_claim')")).scalar() is None:
            pytest.skip("the knowledge tables are not migrated")


def _claim(s, subject: uuid.UUID, scopes: list[uuid.UUID], value: str) -> uuid.UUID:  # type: ignore[no-untyped-def]
    claim: uuid.UUID = s.execute(text("""
        insert into knowledge.fact_claim (content_id, subject_id, predicate, object_value, object_datatype,
                                          scopes, epistemic_kind)
        values (knowledge.intern_content(:c), :s, 'role', :v, 'string', :sc, 'world_fact') returning id"""),
        {"c": f"role {value}", "s": subject, "v": value, "sc": scopes}).scalar_one()
    return claim


def test_fact_from_a_chunk_is_traced_and_exported(
        knowledge: None, app_engine: Engine, auditor_engine: Engine, tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team")
    d = put(app_engine, t, "people.md", "Ann Lee is the lead engineer of the bridge project. " * 5)
    with bound_session(app_engine, t.identity("extractor", write=("team",))) as s:
        extractor = ensure_agent(s, "software", "engram-extractor", "0.1")
        act = begin_activity(s, "ingest.extract", {"document": str(d)}, agent=extractor)
        chunk = s.execute(select(Chunk.id).where(Chunk.document_id == d)).scalars().first()
        ann = s.execute(text("select knowledge.resolve_entity('person', 'Ann Lee', :sc)"),
                        {"sc": [t.scopes["team"]]}).scalar_one()
        claim = _claim(s, ann, [t.scopes["team"]], "lead engineer")
        record_derivation(s, ("knowledge.fact_claim", {"id": str(claim)}),
                          [("sources.chunks", {"id": str(chunk)})])
        end_activity(s)
    with auditor_engine.connect() as conn:
        (rep,) = verify(conn, t.id)
        assert rep.ok, (rep.chain_break, rep.row_problems)
        tables = set(conn.execute(text("select distinct table_name from provenance.events "
                                       "where tenant_id = :t"), {"t": t.id}).scalars())
        back = lineage(conn, t.id, "knowledge.fact_claim", {"id": str(claim)})
        ttl = export(conn, t.id, "ttl")
    assert {"knowledge.entities", "knowledge.fact_content", "knowledge.fact_claim"} <= tables
    assert back.proven()
    (edge,) = back.edges
    assert edge.source == ("sources.chunks", f'{{"id":"{chunk}"}}') and edge.activity_id == act
    g = Graph().parse(data=ttl, format="turtle")
    n = Names(t.id)
    fact = n.version(edge.derived_version)
    assert (fact, PROV.wasDerivedFrom, n.version(edge.source_version or b"")) in g
    assert (n.activity(act), PROV.wasAssociatedWith, n.agent(extractor)) in g
    assert (fact, PROV.wasGeneratedBy, n.activity(act)) in g


def test_an_open_writer_blocks_nobody_and_commits_number_the_chain(
        app_engine: Engine, auditor_engine: Engine, tenant_factory: TenantMaker) -> None:
    a, b = tenant_factory("team"), tenant_factory("team")
    with bound_session(app_engine, a.identity("slow", write=("team",))) as held:
        held_id = put_document(held, doc("held.md")).document_id
        # The chain is numbered at commit: writers of the same tenant, and of others, go ahead.
        second = _write_with_timeout(app_engine, a, "second.md", "2s")
        _write_with_timeout(app_engine, b, "other.md", "2s")
    with auditor_engine.connect() as conn:
        seq = {r.row_id["id"]: r.seq for r in conn.execute(text(
            "select row_id, seq from provenance.events where tenant_id = :t "
            "and table_name = 'sources.documents'"), {"t": a.id})}
        (rep,) = verify(conn, a.id)
    assert seq[str(second)] < seq[str(held_id)], "events are numbered in commit order"
    assert rep.ok


def _write_with_timeout(app_engine: Engine, t: TenantFixture, path: str, timeout: str) -> uuid.UUID:
    with bound_session(app_engine, t.identity("second", write=("team",))) as s:
        s.execute(text("select set_config('lock_timeout', :v, true)"), {"v": timeout})
        return put_document(s, doc(path)).document_id
