"""Filtered approximate nearest-neighbour search under RLS.

The ANN scan runs over rows that carry their visibility columns, and the app
role has pgvector's iterative index scans on, so a small tenant's top-k is never
starved by other tenants' rows crowding the index's first candidates.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, select, text

from orchestrator.db.models import Chunk
from orchestrator.db.session import bound_session
from tests.conftest import TenantFixture

DIM = 384
TOTAL = 20_000
SMALL_SHARE = 0.01


def _vec(rng: random.Random) -> list[float]:
    return [rng.uniform(-1, 1) for _ in range(DIM)]


def _literal(v: list[float]) -> str:
    return "[" + ",".join(f"{x:.5f}" for x in v) + "]"


def _fill(admin_engine: Engine, tenant: TenantFixture, n: int, docs: int) -> None:
    """Insert n chunks with random embeddings for a tenant, as the fixture superuser."""
    with admin_engine.begin() as conn:
        conn.execute(text(
            "insert into sources.documents (tenant_id, collection, path, title, body, scopes) "
            "select :t, 'bulk', 'doc-' || g, 'Doc ' || g, 'bulk body', :s "
            "from generate_series(1, :d) g"), {"t": tenant.id, "s": list(tenant.scopes.values()),
                                               "d": docs})
        conn.execute(text(
            "insert into sources.chunks (tenant_id, document_id, ordinal, text, char_start, "
            "char_end, embedding, embed_state) "
            "select d.tenant_id, d.id, g, 'chunk ' || g, 0, 7, "
            "  (select array_agg(random() * 2 - 1) from generate_series(1, :dim) x "
            "    where x > 0 * g)::vector, 'ready' "
            "from sources.documents d, generate_series(0, :per - 1) g "
            "where d.tenant_id = :t"), {"t": tenant.id, "dim": DIM, "per": n // docs})


@pytest.fixture(scope="module")
def corpus(admin_engine: Engine, tenant_factory: Callable[..., TenantFixture]
           ) -> Iterator[tuple[TenantFixture, list[TenantFixture]]]:
    small = tenant_factory("team")
    bigs = [tenant_factory("team") for _ in range(3)]
    small_n = int(TOTAL * SMALL_SHARE)
    _fill(admin_engine, small, small_n, 20)
    per_big = (TOTAL - small_n) // len(bigs)
    for big in bigs:
        _fill(admin_engine, big, per_big, 60)
    with admin_engine.begin() as conn:
        conn.execute(text("analyze sources.chunks"))
    yield small, bigs
    with admin_engine.begin() as conn:
        conn.execute(text("delete from auth.tenants where id = any(:ids)"),
                     {"ids": [small.id] + [b.id for b in bigs]})


def _top10(app_engine: Engine, tenant: TenantFixture, query: list[float], *, force_ann: bool,
           iterative: bool = True) -> tuple[list[object], str]:
    stmt = (select(Chunk.tenant_id)
            .order_by(Chunk.embedding.cosine_distance(query)).limit(10))
    with bound_session(app_engine, tenant.identity(read=("team",))) as s:
        if force_ann:
            # Only the HNSW index yields rows in distance order, so with sorting
            # disabled the planner must take the ANN path.
            s.execute(text("set local enable_sort = off"))
        if not iterative:
            s.execute(text("set local hnsw.iterative_scan = off"))
        compiled = stmt.compile(dialect=s.get_bind().dialect,
                                compile_kwargs={"literal_binds": True})
        plan = "\n".join(s.execute(text(f"explain {compiled}")).scalars())
        rows = list(s.execute(stmt).scalars())
    return rows, plan


pytestmark = pytest.mark.slow


def test_small_tenant_gets_a_full_top10(app_engine: Engine, corpus) -> None:  # type: ignore[no-untyped-def]
    small, _ = corpus
    query = _vec(random.Random(7))
    rows, plan = _top10(app_engine, small, query, force_ann=True)
    assert "ix_chunks_embedding_hnsw" in plan, plan
    assert len(rows) == 10
    assert set(rows) == {small.id}

    planned_rows, _ = _top10(app_engine, small, query, force_ann=False)
    assert len(planned_rows) == 10 and set(planned_rows) == {small.id}


def test_without_iterative_scans_the_small_tenant_starves(app_engine: Engine, corpus) -> None:  # type: ignore[no-untyped-def]
    """The control: the setting is what keeps the top-10 full."""
    small, _ = corpus
    rows, plan = _top10(app_engine, small, _vec(random.Random(7)), force_ann=True, iterative=False)
    assert "ix_chunks_embedding_hnsw" in plan
    assert len(rows) < 10


def test_hidden_nearest_chunk_never_returned(app_engine: Engine, admin_engine: Engine,
                                            corpus) -> None:  # type: ignore[no-untyped-def]
    small, _ = corpus
    # A second scope of the small tenant holds the exact query vector.
    rng = random.Random(11)
    query = _vec(rng)
    with admin_engine.begin() as conn:
        hidden_scope = conn.execute(text(
            "insert into auth.scopes (tenant_id, name) values (:t, 'hidden') returning id"),
            {"t": small.id}).scalar_one()
        doc = conn.execute(text(
            "insert into sources.documents (tenant_id, collection, path, title, body, scopes) "
            "values (:t, 'secret', 'nearest.md', 'Nearest', 'secret', array[cast(:s as uuid)]) "
            "returning id"), {"t": small.id, "s": str(hidden_scope)}).scalar_one()
        hidden_chunk = conn.execute(text(
            "insert into sources.chunks (tenant_id, document_id, ordinal, text, char_start, "
            "char_end, embedding, embed_state) values (:t, :d, 0, 'secret', 0, 6, "
            "cast(:v as vector), 'ready') returning id"),
            {"t": small.id, "d": doc, "v": _literal(query)}).scalar_one()
    for force in (True, False):
        with bound_session(app_engine, small.identity(read=("team",))) as s:
            if force:
                s.execute(text("set local enable_sort = off"))
            ids = list(s.execute(select(Chunk.id).order_by(
                Chunk.embedding.cosine_distance(query)).limit(10)).scalars())
        assert len(ids) == 10
        assert hidden_chunk not in ids
    # The scope holder does get it first.
    with bound_session(app_engine, small.identity(read=("hidden",))) as s:
        top = s.execute(select(Chunk.id).order_by(
            Chunk.embedding.cosine_distance(query)).limit(1)).scalar_one()
    assert top == hidden_chunk
