"""The VectorChord tier's DDL, compiled on a server without VectorChord.

This machine's server has no ``vchord``; the statements the VectorChord tier
runs are still checked by PostgreSQL's own parser: PL/pgSQL parses every SQL
statement of a function body when the function is created, without running it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from orchestrator.config import Settings
from tests.support.recall import embedder, recaller
from tests.support.tiers import TIERS, tier_facts

__all__ = ["embedder", "recaller"]

REVISION = Path(__file__).resolve().parents[1] / "db" / "versions" / "0003_index_tier.py"


def _revision() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rev_0003", REVISION)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(admin_engine: Engine, statement: str) -> None:
    body = statement if statement.startswith("declare ") else f"begin\n  {statement};\nend"
    with admin_engine.connect() as conn, conn.begin():
        conn.execute(text("set local check_function_bodies = on"))
        conn.exec_driver_sql(
            "create function pg_temp.vchord_ddl_check() returns void language plpgsql "
            f"as $engram_check$\n{body}\n$engram_check$".replace("%", "%%")
        )
        conn.rollback()


REV = _revision()
STATEMENTS = [*REV.VECTORCHORD_EXTENSIONS, *REV.VECTORCHORD_DDL,
              REV._role_settings(REV.VECTORCHORD_ROLE_SETTINGS)]


@pytest.mark.parametrize("statement", STATEMENTS, ids=[s[:50] for s in STATEMENTS])
def test_vectorchord_statement_parses(admin_engine: Engine, statement: str) -> None:
    _compile(admin_engine, statement)


def test_a_broken_statement_is_caught(admin_engine: Engine) -> None:
    with pytest.raises(ProgrammingError, match="syntax error"):
        _compile(admin_engine, "create index ix on sources.chunks usin vchordrq (embedding)")


def test_vectorchord_indexes_cover_the_same_columns_as_pgvector() -> None:
    vchord = " ".join(REV.VECTORCHORD_DDL)
    pgvector = " ".join(REV.PGVECTOR_DDL)
    assert "(embedding vector_cosine_ops)" in vchord and "(embedding vector_cosine_ops)" in pgvector
    assert "using vchordrq" in vchord and "using bm25" in vchord
    assert "vchordrq.prefilter = on" in REV.VECTORCHORD_ROLE_SETTINGS
    assert REV.TIER_INDEXES == {"ix_chunks_embedding_vchordrq", "ix_chunks_bm25",
                                "ix_chunks_embedding_hnsw", "ix_chunks_tenant_id_lexical"}


def test_this_server_runs_the_portable_tier(admin_engine: Engine) -> None:
    with admin_engine.connect() as conn:
        available = REV.vectorchord_available(conn)
        tier = conn.execute(text(
            "select value from engram.installation where key = 'index_tier'")).scalar_one()
    assert tier == ("vectorchord" if available else "pgvector")


def _revision_file(name: str) -> ModuleType:
    path = REVISION.with_name(name)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LEXICAL = _revision_file("0012_vectorchord_lexical.py")
LEXICAL_STATEMENTS = [*LEXICAL.VECTORCHORD_LEXICAL_DDL, *LEXICAL.VECTORCHORD_BACKFILL,
                      LEXICAL._role_settings(LEXICAL.VECTORCHORD_ROLE_SETTINGS),
                      LEXICAL._role_settings(LEXICAL.VECTORCHORD_ROLE_SETTINGS, reset=True)]


@pytest.mark.parametrize("statement", LEXICAL_STATEMENTS, ids=[s[:50] for s in LEXICAL_STATEMENTS])
def test_vectorchord_lexical_statement_parses(admin_engine: Engine, statement: str) -> None:
    _compile(admin_engine, statement)


def _recall_sql(tier: str) -> str:
    """The recall statement of ``tier`` as SQL text, every parameter a NULL (parse only)."""
    import re

    from sqlalchemy.dialects import postgresql

    from orchestrator.recall.statement import StatementLimits, build_recall_statement

    sql = str(build_recall_statement(limits=StatementLimits(), index_tier=tier)
              .compile(dialect=postgresql.dialect()))
    sql = re.sub(r"\(__\[POSTCOMPILE_[^\]]+\]\)", "(NULL)", sql)
    return re.sub(r"%\([^)]+\)s", "NULL", sql)


def test_both_tiers_compile_the_same_recall_statement(admin_engine: Engine) -> None:
    """Since 0070 the tiers differ in the chunks' vector index only: the statement is the
    same text, so every assertion on its lanes (lexical scores and statistics included)
    holds on both. The VectorChord text is compiled here; the server cannot run it."""
    vc, pg = _recall_sql("vectorchord"), _recall_sql("pgvector")
    assert vc == pg
    assert "<&>" not in vc and "bm25_catalog" not in vc and "tokenizer_catalog" not in vc
    for sql in (vc, pg):
        _compile(admin_engine, f"declare r record; begin for r in {sql} loop null; end loop; end")


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_tier_facts_match_the_statement(tier: str) -> None:
    """tests/support/tiers.py says what each tier guarantees; the compiled statement agrees."""
    facts = TIERS[tier]
    sql = _recall_sql(tier)
    lexical = sql[sql.index("lexical_candidates AS"):sql.index("lexical_hits AS")]
    # Candidates: the caller's tenant first, no global top-k before the tenant filter: the
    # only LIMIT is each query term's share of the row budget, inside the tenant's chunks
    # (0041: the rarest terms' chunks first, up to recall_lexical_rows).
    assert facts.lexical_tenant_first == (
        "WHERE sources.chunks.tenant_id = auth.tenant_id() AND (sources.chunks.lexical @@" in lexical
        and lexical.count("LIMIT") == 1 and "LIMIT lexical_budget.take" in lexical)
    # Document frequencies: the caller's tenant's folded counts and unfolded deltas only.
    df = sql[sql.index("lexical_df AS"):sql.index("lexical_budget AS")]
    assert facts.lexical_stats_visible_only == (
        "recall.lexical_terms.tenant_id = auth.tenant_id()" in df
        and "recall.lexical_term_deltas.tenant_id = auth.tenant_id()" in df)
    # Scores: BM25 from the matched tsvectors with the corpus statistics.
    assert facts.lexical_scores == ("ln(" in sql and "lexical_corpus" in sql)
    # Statistics: recall.lexical_stats of the caller's tenant (RLS narrows it to the visible
    # scope sets), returned as the lexical_stats row the trace shows.
    stats = sql[sql.index("lexical_corpus AS"):]
    assert facts.lexical_stats == ("CAST(CAST(lexical_corpus.n AS BIGINT) AS BIGINT) AS item_count"
                                   in sql)
    assert facts.lexical_stats_visible_only == (
        "recall.lexical_stats.tenant_id = auth.tenant_id()" in stats[:400])
    assert facts.dense_index == {"pgvector": "hnsw", "vectorchord": "vchordrq"}[tier]


TIER_REV = _revision_file("0070_vectorchord_tier.py")


def _tier_statements() -> list[str]:
    from orchestrator.db import indexes

    statements = [*TIER_REV.VECTORCHORD_TIER_DDL]
    for lists in (0, indexes.vchordrq_lists(1_000_000)):
        statements.append(indexes.vchordrq_create(indexes.VCHORDRQ_INDEX, lists, concurrently=False))
        statements.extend(indexes.vchordrq_probe_settings(lists))
        # The migration's frozen copy of the rule builds the same statements.
        assert TIER_REV.vchordrq_lists(1_000_000 if lists else 0) == lists
        assert TIER_REV.vchordrq_create(TIER_REV.VCHORDRQ_INDEX, lists) == statements[-3]
        assert TIER_REV.vchordrq_probe_settings(lists) == statements[-2:]
    statements.extend(indexes.vchordrq_step("sources", indexes.VCHORDRQ_INDEX,
                                            REV.VECTORCHORD_DDL[2], 250_000).statements)
    return statements


@pytest.mark.parametrize("statement", _tier_statements(), ids=[s[:50] for s in _tier_statements()])
def test_vectorchord_tier_statement_parses(admin_engine: Engine, statement: str) -> None:
    _compile(admin_engine, statement)


def test_vchordrq_lists_are_sized_from_the_table() -> None:
    from orchestrator.db import indexes

    assert indexes.vchordrq_lists(0) == 0 and indexes.vchordrq_lists(49_999) == 0
    assert indexes.vchordrq_lists(50_000) == 894 and indexes.vchordrq_lists(1_000_000) == 4000
    assert indexes.vchordrq_probes(0) == 0 and indexes.vchordrq_probes(4000) == 200
    assert indexes.vchordrq_probes(10) == 1
    # The lists an index was built with, read back from its definition.
    assert indexes.lists_in(REV.VECTORCHORD_DDL[2]) == 0
    assert indexes.lists_in(indexes.vchordrq_create("ix", 894, concurrently=True)) == 894
    assert indexes.lists_in("create index ix on t using hnsw (e)") is None


def test_vchordrq_is_rebuilt_in_place_or_replaced() -> None:
    """The index 0003 built (lists = []) is replaced once the table outgrows a flat scan;
    one whose lists fit is rebuilt in place. Both keep serving reads and writes."""
    from orchestrator.db import indexes

    small = indexes.vchordrq_step("sources", indexes.VCHORDRQ_INDEX, REV.VECTORCHORD_DDL[2], 10_000)
    assert small.statements[0] == f"reindex index concurrently sources.{indexes.VCHORDRQ_INDEX}"
    big = indexes.vchordrq_step("sources", indexes.VCHORDRQ_INDEX, REV.VECTORCHORD_DDL[2], 250_000)
    assert "lists [] -> [2000]" in big.reason
    assert [s.split()[0:3] for s in big.statements[:4]] == [
        ["drop", "index", "concurrently"], ["create", "index", "concurrently"],
        ["drop", "index", "concurrently"], ["alter", "index", "sources.ix_chunks_embedding_vchordrq_new"]]
    assert "lists = [2000]" in big.statements[1]
    assert any("vchordrq.probes = %L', current_database(), '100'" in s for s in big.statements)


def test_an_unknown_index_tier_is_refused() -> None:
    from orchestrator.recall.statement import StatementLimits, build_recall_statement

    with pytest.raises(ValueError, match="unknown index tier 'lucene'"):
        build_recall_statement(limits=StatementLimits(), index_tier="lucene")


# -- engram db reindex on this server's tier -------------------------------------------


def _relfilenodes(admin_engine: Engine) -> dict[str, int]:
    with admin_engine.connect() as conn:
        return {str(r[0]): int(r[1]) for r in conn.execute(text(
            "select c.oid::regclass::text, c.relfilenode from pg_index i "
            "join pg_class c on c.oid = i.indexrelid join pg_am am on am.oid = c.relam "
            "where am.amname in ('hnsw', 'gin', 'vchordrq')"))}


def test_db_reindex_rebuilds_every_vector_and_text_index(settings: Settings, admin_engine: Engine,
                                                         tenant_factory: Any) -> None:
    """pgvector tier: every HNSW and GIN index is rebuilt concurrently (new files), and the
    invalid leftover of a failed concurrent build is dropped. (VectorChord tier: the same
    command runs the vchordrq steps compiled above.)"""
    from typer.testing import CliRunner

    from orchestrator.cli.main import app
    from tests.support.cli import engram_env

    t = tenant_factory("team")
    with admin_engine.begin() as conn:
        doc = conn.execute(text(
            "insert into sources.documents (tenant_id, collection, path, title, body, scopes) "
            "values (:t, 'n', 'reindex.md', 'r', 'words', array[cast(:s as uuid)]) returning id"),
            {"t": t.id, "s": t.scopes["team"]}).scalar_one()
        conn.execute(text("insert into sources.chunks (tenant_id, document_id, ordinal, text, "
                          "char_start, char_end) values (:t, :d, 0, 'not a number', 0, 12)"),
                     {"t": t.id, "d": doc})
    # A concurrent build that fails on that row leaves an invalid index behind.
    raw = admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        with pytest.raises(DBAPIError):
            raw.exec_driver_sql("create index concurrently ix_chunks_reindex_probe on sources.chunks "
                                "using gin (tenant_id, to_tsvector('english', (text::int)::text))")
    finally:
        raw.close()
    before = _relfilenodes(admin_engine)
    assert "sources.ix_chunks_reindex_probe" in before

    env = engram_env(settings)
    result = CliRunner().invoke(app, ["db", "reindex", "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    assert "sources.ix_chunks_reindex_probe (gin): invalid" in result.output
    assert _relfilenodes(admin_engine) == before, "--dry-run changes nothing"

    result = CliRunner().invoke(app, ["db", "reindex"], env=env)
    assert result.exit_code == 0, result.output
    after = _relfilenodes(admin_engine)
    assert "sources.ix_chunks_reindex_probe" not in after
    rebuilt = [name for name in after if name.startswith(("sources.", "knowledge.", "memory."))]
    assert "sources.ix_chunks_embedding_hnsw" in rebuilt and "sources.ix_chunks_tenant_id_lexical" in rebuilt
    for name in rebuilt:
        assert after[name] != before[name], f"{name} was not rebuilt"
        assert f"rebuilt {name} in " in result.output


# -- the small tenant's lexical lane ---------------------------------------------------


def test_a_small_tenant_is_never_starved_by_a_large_one(tenant_factory: Any, app_engine: Engine,
                                                      settings: Settings, recaller: Any) -> None:
    """A large tenant's documents all say "harbour", and score higher than the small tenant's
    one. Checked on every tier (tests/support/tiers.py: the same lexical statement): the small
    tenant's chunk is its lexical lane's first candidate, with a BM25 score, and the corpus
    statistics the trace shows count its one visible chunk only. (The lane 0003/0012 gave
    the VectorChord tier took the index's global top 100 before the tenant filter: this
    tenant would have got nothing.)"""
    from orchestrator.db.session import bound_session
    from orchestrator.ingest.documents import put_document
    from tests.support.recall import doc

    facts = tier_facts(app_engine)
    big = tenant_factory("team")
    small = tenant_factory("team")
    with bound_session(app_engine, big.identity(write=("team",))) as session:
        for i in range(120):
            put_document(session, doc(f"h{i}.md", f"Harbour log {i}",
                                      "harbour harbour harbour: the harbour crane moved boxes at "
                                      f"the harbour, shift {i}."), settings)
    with bound_session(app_engine, small.identity(write=("team",))) as session:
        put_document(session, doc("note.md", "Weekend", "We walked past the old harbour and a "
                                  "bakery, then took the long road home through the fields."),
                     settings)
    _, trace = recaller.trace(small.identity(read=("team",)), "harbour")
    lexical = trace.pools["lexical"]
    assert lexical and lexical[0].label.startswith("Weekend")
    assert len(lexical) == 1, "no other tenant's chunk is ever a candidate"
    if facts.lexical_scores:
        assert lexical[0].lanes["bm25"] > 0
    if facts.lexical_stats_visible_only:
        assert trace.corpus["chunks"] == 1
    # The large tenant still sees its own, ranked by its own statistics.
    _, big_trace = recaller.trace(big.identity(read=("team",)), "harbour")
    assert len(big_trace.pools["lexical"]) == settings.recall_lexical_k
    assert big_trace.corpus["chunks"] == 120
