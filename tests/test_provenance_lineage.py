"""PROV-O lineage: derivations pinned to chained versions, walks both ways, export round trip."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from rdflib import RDF, Graph, URIRef
from rdflib.namespace import PROV
from sqlalchemy import Engine, select, text

from orchestrator.audit.export import Names, build_graph, export
from orchestrator.audit.lineage import (
    begin_activity,
    end_activity,
    ensure_agent,
    lineage,
    record_derivation,
    record_derivations,
)
from orchestrator.db.models import Chunk
from orchestrator.db.session import bound_session
from orchestrator.errors import BadInput, Forbidden, NotFound
from orchestrator.ingest.documents import put_document
from tests.conftest import TenantFixture
from tests.support.provenance import auditor_engine, doc, put

__all__ = ["auditor_engine"]

TenantMaker = Callable[..., TenantFixture]
DOCS = "sources.documents"
CHUNKS = "sources.chunks"


def _rid(value: uuid.UUID) -> dict[str, str]:
    return {"id": str(value)}


@pytest.fixture
def derived_fact(app_engine: Engine,
                 tenant_factory: TenantMaker) -> tuple[TenantFixture, dict[str, uuid.UUID]]:
    """A 'fact' (a summary document) derived from chunks of two documents, plus an embedding agent.

    The knowledge tables are another domain's; a summary document stands in for a
    derived row, which is what the lineage machinery is generic over.
    """
    t = tenant_factory("team")
    src_a = put(app_engine, t, "src-a.md", "Alpha facts about the river. " * 10)
    src_b = put(app_engine, t, "src-b.md", "Beta facts about the bridge. " * 10)
    summary = put(app_engine, t, "summary.md", "The river has a bridge.")
    ident = t.identity("deriver", write=("team",))
    with bound_session(app_engine, ident) as s:
        model = ensure_agent(s, "model", "sentence-transformers/all-MiniLM-L6-v2", "1")
        assert ensure_agent(s, "model", "sentence-transformers/all-MiniLM-L6-v2", "1") == model
        act = begin_activity(s, "derive.summary", {"job": "test"}, agent=model)
        chunk_a = s.execute(select(Chunk.id).where(Chunk.document_id == src_a)).scalars().first()
        chunk_b = s.execute(select(Chunk.id).where(Chunk.document_id == src_b)).scalars().first()
        assert chunk_a and chunk_b
        record_derivation(s, (CHUNKS, _rid(chunk_a)), [(DOCS, _rid(src_a))], relation="wasQuotedFrom")
        record_derivation(s, (DOCS, _rid(summary)), [(CHUNKS, _rid(chunk_a)), (CHUNKS, _rid(chunk_b))])
        record_derivation(s, (DOCS, _rid(summary)), agent=model)
        end_activity(s)
    return t, {"src_a": src_a, "src_b": src_b, "summary": summary, "chunk_a": chunk_a,
               "chunk_b": chunk_b, "model": model, "activity": act}


def test_lineage_back_to_origins_with_chain_proof(
        auditor_engine: Engine, derived_fact: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, ids = derived_fact
    with auditor_engine.connect() as conn:
        back = lineage(conn, t.id, DOCS, _rid(ids["summary"]))
    sources = {(e.source, e.depth) for e in back.edges if e.source}
    assert ((CHUNKS, f'{{"id":"{ids["chunk_a"]}"}}'), 1) in sources
    assert ((CHUNKS, f'{{"id":"{ids["chunk_b"]}"}}'), 1) in sources
    assert ((DOCS, f'{{"id":"{ids["src_a"]}"}}'), 2) in sources, "origins two steps back"
    assert any(e.source_agent_id == ids["model"] for e in back.edges)
    assert all(e.event is not None and e.activity_id == ids["activity"] for e in back.edges)
    assert back.proven()


def test_lineage_forward_and_unproven_when_a_step_is_missing(
        admin_engine: Engine, auditor_engine: Engine,
        derived_fact: tuple[TenantFixture, dict[str, uuid.UUID]]) -> None:
    t, ids = derived_fact
    with auditor_engine.connect() as conn:
        fwd = lineage(conn, t.id, DOCS, _rid(ids["src_a"]), direction="forward")
    derived = {e.derived for e in fwd.edges}
    assert (DOCS, f'{{"id":"{ids["summary"]}"}}') in derived
    assert (CHUNKS, f'{{"id":"{ids["chunk_a"]}"}}') in derived
    assert fwd.proven()
    # A derivation edge smuggled in without its chain event is not proven.
    with admin_engine.begin() as conn:
        conn.execute(text("set local session_replication_role = replica"))
        conn.execute(text("delete from provenance.events where tenant_id = :t "
                          "and table_name = 'provenance.derivations'"), {"t": t.id})
    with auditor_engine.connect() as conn:
        assert not lineage(conn, t.id, DOCS, _rid(ids["src_a"]), direction="forward").proven()


def test_derivation_bad_input_is_refused(app_engine: Engine, tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team", "exec")
    other = tenant_factory("team")
    mine = put(app_engine, t, "mine.md")
    theirs = put(app_engine, other, "theirs.md")
    ident = t.identity("bob", write=("team",))
    with pytest.raises(BadInput, match="relation"), bound_session(app_engine, ident) as s:
        record_derivation(s, (DOCS, _rid(mine)), [(DOCS, _rid(mine))], relation="wasInventedBy")
    with pytest.raises(BadInput, match="does not exist or is not visible"), \
            bound_session(app_engine, ident) as s:
        record_derivation(s, (DOCS, _rid(mine)), [(DOCS, _rid(theirs))])
    with pytest.raises(BadInput, match="exactly the keys"), bound_session(app_engine, ident) as s:
        record_derivation(s, (DOCS, {"path": "mine.md"}), [(DOCS, _rid(mine))])
    with pytest.raises(BadInput, match="not a chained"), bound_session(app_engine, ident) as s:
        record_derivation(s, ("auth.scopes", _rid(mine)), [(DOCS, _rid(mine))])
    with bound_session(app_engine, ident) as s:
        assert s.execute(text("select count(*) from provenance.derivations")).scalar_one() == 0


def test_batched_derivations_pin_current_versions_and_refuse_as_a_whole(
        app_engine: Engine, tenant_factory: TenantMaker) -> None:
    """``record_derivations`` stores each edge with its rows' current versions, in batches; a
    batch naming a row the writer cannot see stores nothing. (Forged and stale written
    versions, which this writer never sends, are refused in sql_checks/25.)"""
    t = tenant_factory("team", "exec")
    docs = [put(app_engine, t, f"d{i}.md", f"Document {i} about the harbour. " * 5) for i in range(30)]
    with bound_session(app_engine, t.identity("alice", write=("exec",))) as s:
        secret = put_document(s, doc("secret.md", "Exec only.", scopes=("exec",))).document_id
    ident = t.identity("bob", write=("team",))
    with bound_session(app_engine, ident) as s:
        chunks = s.execute(select(Chunk.id, Chunk.document_id)).all()
        edges = [((CHUNKS, _rid(c)), (DOCS, _rid(d))) for c, d in chunks]
        assert record_derivations(s, edges, batch=7) == len(edges) >= len(docs)
        stored = s.execute(text(
            "select count(*) filter (where derived_version = provenance.row_version("
            "'sources.chunks', derived_row_id) and source_version = provenance.row_version("
            "'sources.documents', source_row_id)), count(*) from provenance.derivations")).one()
        assert stored == (len(edges), len(edges))
    with pytest.raises(BadInput, match="does not exist or is not visible"), \
            bound_session(app_engine, ident) as s:
        record_derivations(s, [*edges, ((CHUNKS, _rid(chunks[0][0])), (DOCS, _rid(secret)))])
    with bound_session(app_engine, ident) as s:
        assert s.execute(text("select count(*) from provenance.derivations")).scalar_one() == len(edges)


def test_activity_rules(app_engine: Engine, tenant_factory: TenantMaker) -> None:
    t = tenant_factory("team")
    with pytest.raises(NotFound, match="no activity"), \
            bound_session(app_engine, t.identity(write=("team",))) as s:
        end_activity(s)
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        act = begin_activity(s, "api.request")
    with pytest.raises(NotFound, match="not yours"), \
            bound_session(app_engine, t.identity("mallory", write=("team",))) as s:
        end_activity(s, act)
    with pytest.raises(Forbidden), bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        s.execute(text("update provenance.activities set kind = 'other' where id = :a"), {"a": act})
    with pytest.raises(BadInput), bound_session(app_engine, t.identity(write=("team",))) as s:
        begin_activity(s, "Not A Kind!")


@pytest.mark.parametrize("fmt", ["jsonld", "ttl"])
def test_export_parses_and_round_trips_lineage(
        auditor_engine: Engine, derived_fact: tuple[TenantFixture, dict[str, uuid.UUID]], fmt: str) -> None:
    t, ids = derived_fact
    with auditor_engine.connect() as conn:
        doc = export(conn, t.id, fmt)  # type: ignore[arg-type]
        back = lineage(conn, t.id, DOCS, _rid(ids["summary"]))
        direct = build_graph(conn, t.id)
    g = Graph().parse(data=doc, format="json-ld" if fmt == "jsonld" else "turtle")
    assert len(g) == len(direct) > 0
    # Every PROV term used is a term of the PROV-O vocabulary.
    prov = str(PROV)
    used = {str(x) for triple in g for x in triple if str(x).startswith(prov)}
    assert used and all(URIRef(u) in PROV for u in used), used - {u for u in used if URIRef(u) in PROV}
    # ... and each is used as what it is: properties as predicates, classes as types.
    for _, p, o in g:
        if str(p).startswith(prov):
            assert str(p)[len(prov)][0].islower(), p
        if p == RDF.type and str(o).startswith(prov):
            assert str(o)[len(prov)][0].isupper(), o
    # The derived fact's sources, read back from RDF, are exactly the lineage's.
    names = Names(t.id)
    summary_edges = [e for e in back.edges if e.derived == (DOCS, f'{{"id":"{ids["summary"]}"}}')]
    start = names.version(summary_edges[0].derived_version)
    from_rdf = {str(o) for o in g.transitive_objects(start, PROV.wasDerivedFrom)} - {str(start)}
    expected = {str(names.version(e.source_version)) for e in back.edges if e.source_version}
    expected |= {str(names.agent(ids["model"]))}
    assert from_rdf == expected
    assert (names.activity(ids["activity"]), PROV.wasAssociatedWith, names.agent(ids["model"])) in g
    for e in summary_edges:
        if e.source_version is not None:
            assert (names.activity(ids["activity"]), PROV.used, names.version(e.source_version)) in g
    # Every version is attributed to the user whose write made it.
    assert (start, PROV.wasAttributedTo, names.user("alice")) in g
