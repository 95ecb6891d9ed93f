"""A tenant's own vector index (``engram db tenant-index``, ``recall.plans.tenant_size``).

The partial HNSW index is built by the migrating role; recall finds it under the caller's
identity and names the tenant in its dense lane so the planner can use it. Each test builds
its own tenants; the indexes it builds are dropped at its end (the database is shared).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.db import indexes
from orchestrator.db.schema import schema_drift
from orchestrator.db.session import bound_session
from orchestrator.recall import FULL_PLAN
from orchestrator.recall.plans import TenantSize, size_class, tenant_size, transaction_settings
from orchestrator.recall.service import vector_text
from tests.support.cli import engram_env
from tests.support.recall import doc, embedder, recaller_with, write_documents
from tests.support.tiers import tier_facts

__all__ = ["embedder"]


def _tenant(tenant_factory: Any, app_engine: Engine, embedder: Any, settings: Any, name: str) -> Any:
    t = tenant_factory("team", org_prefix=name)
    write_documents(app_engine, t.identity("writer", write=("team",)), embedder,
                    [doc(f"{name}-{n}.md", f"{name} note {n}",
                         f"The {name} crew logged item {n}: the river bridge, the budget and "
                         f"lantern number {n * 7} by the harbour.") for n in range(8)], settings)
    return t


@pytest.fixture
def pgvector_tier(app_engine: Engine) -> None:
    if tier_facts(app_engine).dense_index != "hnsw":
        pytest.skip("a tenant's own vector index is for the pgvector tier (the VectorChord tier "
                    "refuses it: test_the_vectorchord_tier_refuses_a_tenant_index)")


@pytest.fixture
def built(admin_engine: Engine) -> Iterator[list[str]]:
    """Tenant indexes a test built; dropped afterwards."""
    names: list[str] = []
    yield names
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for name in names:
            conn.exec_driver_sql(f"drop index concurrently if exists {name}")


def _build(admin_engine: Engine, org: str, built: list[str]) -> str:
    """The tenant's own indexes; returns the chunks' one."""
    with admin_engine.connect() as conn:
        steps = indexes.tenant_index_steps(conn, org)
        live = indexes.live_vector_indexes(conn)
    assert [s.index.split(".")[1].rsplit("_t_", 1)[0] for s in steps] == \
        [f"ix_{x.table}_embedding" for x in live], "one beside each shared index, chunks last"
    assert live[-1].table == "chunks" and len(live) >= 9
    built.extend(s.index for s in steps)
    indexes.run(admin_engine, steps)
    return steps[-1].index


def _plan(engine: Engine, recaller: Any, reader: Any, size: TenantSize, question: str,
          vector: Any) -> str:
    """The recall statement's plan for ``reader`` as recall sends it, with sorting priced out
    so the plan shows which vector index can order the dense lane (a tiny tenant would
    otherwise be sorted exactly)."""
    with bound_session(engine, reader, settings={**transaction_settings(size, recaller.settings),
                                                  "enable_sort": "off"}) as s:
        return "\n".join(r[0] for r in s.connection().exec_driver_sql(
            "explain (costs off) " + recaller.sql(FULL_PLAN, size_class(size.chunks),
                                                  size.own_index),
            {"question": question, "query_embedding": vector_text(vector), "mode": None,
             "session": None, "days": None, "days_end": None}).all())


def test_a_tenant_with_its_own_index_is_served_from_it_and_serves_the_same_rows(
        pgvector_tier: None, tenant_factory: Any, app_engine: Engine, admin_engine: Engine,
        embedder: Any, settings: Any, built: list[str]) -> None:
    a = _tenant(tenant_factory, app_engine, embedder, settings, "owna")
    b = _tenant(tenant_factory, app_engine, embedder, settings, "ownb")
    ra, rb = a.identity("reader", read=("team",)), b.identity("reader", read=("team",))
    question = "which lantern stood by the harbour bridge?"
    vector = embedder.embed_query(question)
    recaller = recaller_with(app_engine, settings, embedder)
    before = {who: [c.key for c in recaller.trace(r, question)[1].pools["dense"]]
              for who, r in (("a", ra), ("b", rb))}
    with bound_session(app_engine, ra) as s:
        assert tenant_size(s) == TenantSize(8, None)

    name = _build(admin_engine, a.org_id, built)
    assert name == f"sources.{indexes.tenant_index_name(uuid.UUID(str(a.id)))}"
    with bound_session(app_engine, ra) as s:
        size_a = tenant_size(s)
    with bound_session(app_engine, rb) as s:
        size_b = tenant_size(s)
    assert size_a == TenantSize(8, uuid.UUID(str(a.id))) and size_b == TenantSize(8, None)
    # Only the tenant's own text names it (and so may use its index).
    assert str(a.id) in recaller.sql(FULL_PLAN, 0, size_a.own_index)
    assert str(a.id) not in recaller.sql(FULL_PLAN, 0, None)
    short = name.split(".")[1]
    assert short in _plan(app_engine, recaller, ra, size_a, question, vector)
    assert short not in _plan(app_engine, recaller, rb, size_b, question, vector)

    fresh = recaller_with(app_engine, settings, embedder)  # no size cached: finds the index
    _, trace = fresh.trace(ra, question)
    assert "the vector lanes over the tenant's own vector indexes" in trace.plan_note
    assert [c.key for c in trace.pools["dense"]] == before["a"]
    _, trace = fresh.trace(rb, question)
    assert "own vector index" not in trace.plan_note
    assert [c.key for c in trace.pools["dense"]] == before["b"]

    # Every vector lane names the tenant: each lane can use the tenant's index on its table.
    plan = _plan(app_engine, recaller, ra, size_a, question, vector)
    with admin_engine.connect() as conn:
        tables = [x.table for x in indexes.live_vector_indexes(conn)]
    unused = [t for t in tables if indexes.tenant_index_name(uuid.UUID(str(a.id)), t) not in plan]
    assert unused == [], unused

    # Dropped while a recaller still holds the text naming it: the lane falls back to the
    # shared index for that call, and the next size read stops naming it.
    with admin_engine.connect() as conn:
        drop = indexes.tenant_index_steps(conn, a.org_id, drop=True)
    assert drop[0].index == name, "the chunks' one first: recall stops naming the tenant"
    indexes.run(admin_engine, drop)
    _, trace = fresh.trace(ra, question)
    assert [c.key for c in trace.pools["dense"]] == before["a"]
    with bound_session(app_engine, ra) as s:
        assert tenant_size(s).own_index is None


def test_a_wrong_tenant_literal_empties_the_dense_lane_and_never_widens_it(
        pgvector_tier: None, tenant_factory: Any, app_engine: Engine, admin_engine: Engine,
        embedder: Any, settings: Any, built: list[str]) -> None:
    """The literal sits beside ``auth.tenant_id()`` and RLS: even a recaller whose cache named
    another tenant's index (it never does: the id is read under the caller's identity) would
    serve no row of that tenant."""
    a = _tenant(tenant_factory, app_engine, embedder, settings, "wronga")
    b = _tenant(tenant_factory, app_engine, embedder, settings, "wrongb")
    _build(admin_engine, a.org_id, built)
    recaller = recaller_with(app_engine, settings, embedder)
    rb = b.identity("reader", read=("team",))
    recaller.sizes.put(b.org_id, TenantSize(8, uuid.UUID(str(a.id))))
    result, trace = recaller.trace(rb, "which lantern stood by the harbour bridge?")
    assert trace.pools.get("dense", []) == []
    assert result.evidence and all(e.source is None or e.source.path.startswith("wrongb-")
                                   for e in result.evidence)
    assert "wronga" not in result.rendered


def test_an_invalid_tenant_index_is_not_used_and_is_rebuilt(
        pgvector_tier: None, tenant_factory: Any, app_engine: Engine, admin_engine: Engine,
        embedder: Any, settings: Any, built: list[str]) -> None:
    """What a failed concurrent build leaves (marked invalid here by hand) is never named by
    recall, and the command drops and builds it again; the drift check ignores tenant
    indexes."""
    a = _tenant(tenant_factory, app_engine, embedder, settings, "inval")
    name = _build(admin_engine, a.org_id, built)
    with admin_engine.begin() as conn:
        conn.execute(text("update pg_index set indisvalid = false "
                          "where indexrelid = to_regclass(:n)"), {"n": name})
    with bound_session(app_engine, a.identity("reader", read=("team",))) as s:
        assert tenant_size(s).own_index is None
    with admin_engine.connect() as conn:
        steps = indexes.tenant_index_steps(conn, a.org_id)
    assert [s.index for s in steps] == [name], "only the invalid one is built again"
    assert [x.split()[:2] for x in steps[0].statements] == [["drop", "index"], ["CREATE", "INDEX"]]
    indexes.run(admin_engine, steps)
    with bound_session(app_engine, a.identity("reader", read=("team",))) as s:
        assert tenant_size(s).own_index == uuid.UUID(str(a.id))
    with admin_engine.connect() as conn:
        assert schema_drift(conn) == []


def test_the_tenant_index_command(pgvector_tier: None, tenant_factory: Any, app_engine: Engine,
                                  admin_engine: Engine, embedder: Any, settings: Any,
                                  built: list[str]) -> None:
    a = _tenant(tenant_factory, app_engine, embedder, settings, "cmd")
    env = engram_env(settings)
    run = CliRunner().invoke
    listed = run(app, ["db", "tenant-index"], env=env)
    assert listed.exit_code == 0, listed.output
    assert f"{a.org_id}: 8 chunks" in listed.output and "own indexes -" in listed.output

    dry = run(app, ["db", "tenant-index", a.org_id, "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "CREATE INDEX CONCURRENTLY" in dry.output and f"'{a.id}'::uuid" in dry.output
    assert "below about 50,000 chunks the shared indexes serve" in dry.output, "8 chunks: said"
    name = f"sources.{indexes.tenant_index_name(uuid.UUID(str(a.id)))}"
    built.append(name)
    with bound_session(app_engine, a.identity("reader", read=("team",))) as s:
        assert tenant_size(s).own_index is None, "--dry-run builds nothing"

    made = run(app, ["db", "tenant-index", a.org_id], env=env)
    assert made.exit_code == 0, made.output
    with admin_engine.connect() as conn:  # all nine dropped at the end, whatever happens
        built.extend(next(t for t in indexes.tenant_indexes(conn) if t.org == a.org_id).own)
    assert f"built {name} in " in made.output
    again = run(app, ["db", "tenant-index", a.org_id], env=env)
    assert "already has its own vector indexes" in again.output and "built" not in again.output
    live = run(app, ["db", "tenant-index"], env=env).output
    assert f"{a.org_id}: 8 chunks (" in live and "own indexes 9 of 9 (" in live, live

    for args, said in ((["nobody-here"], "no tenant 'nobody-here'"),
                       (["--drop"], "--drop needs the tenant")):
        refused = run(app, ["db", "tenant-index", *args], env=env)
        assert refused.exit_code == 1 and said in refused.output, refused.output

    dropped = run(app, ["db", "tenant-index", a.org_id, "--drop"], env=env)
    assert dropped.exit_code == 0 and f"dropped {name}" in dropped.output, dropped.output
    with bound_session(app_engine, a.identity("reader", read=("team",))) as s:
        assert tenant_size(s).own_index is None


def test_the_vectorchord_tier_refuses_a_tenant_index(tenant_factory: Any, app_engine: Engine,
                                                      admin_engine: Engine) -> None:
    """On VectorChord the vchordrq index prefilters by tenant: the command says so and builds
    nothing. (On pgvector this test checks the refusal's text against a forced tier.)"""
    from orchestrator.errors import BadInput

    t = tenant_factory("team", org_prefix="vchord")
    with admin_engine.connect() as conn:
        if tier_facts(app_engine).dense_index == "hnsw":
            conn.execute(text("update engram.installation set value = 'vectorchord' "
                              "where key = 'index_tier'"))
        with pytest.raises(BadInput, match="for the pgvector tier only"):
            indexes.tenant_index_steps(conn, t.org_id)
        conn.rollback()


def test_the_list_over_an_own_index_is_the_schedules_at_most_its_cap(settings: Any) -> None:
    """A graph of the tenant's rows alone needs no longer list than the shared one: the size
    schedule's ef_search, capped at recall_ef_search_own_index."""
    someone = uuid.uuid4()
    schedule = {0: 200, 4000: 800, 50000: 1000}
    s = settings.model_copy(update={"recall_ef_search_by_chunks": schedule,
                                    "recall_ef_search_own_index": 800})
    assert [transaction_settings(TenantSize(n, someone), s)["hnsw.ef_search"]
            for n in (3000, 20000, 90000)] == ["200", "800", "800"]
    assert [transaction_settings(TenantSize(n), s)["hnsw.ef_search"]
            for n in (3000, 20000, 90000)] == ["200", "800", "1000"]


def test_which_tenants_are_worth_their_own_indexes() -> None:
    """Large and a large share: what `engram db tenant-index` marks in its list."""
    assert indexes.worth_own_indexes(90_000, 300_000)
    assert not indexes.worth_own_indexes(30_000, 100_000), "too small: the shared index serves it"
    assert not indexes.worth_own_indexes(60_000, 1_000_000), "6% of the corpus: under the share the rule asks"
