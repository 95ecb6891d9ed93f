"""The VectorChord tier's DDL, compiled on a server without VectorChord.

This machine's server has no ``vchord``; the statements the VectorChord tier
runs are still checked by PostgreSQL's own parser: PL/pgSQL parses every SQL
statement of a function body when the function is created, without running it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

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


def test_vectorchord_recall_statement_parses(admin_engine: Engine) -> None:
    vc, pg = _recall_sql("vectorchord"), _recall_sql("pgvector")
    # Only the lexical lane differs: the BM25 index's operator instead of the tsvector match.
    assert "<&>" in vc and "bm25_catalog.to_bm25query" in vc and "tokenizer_catalog.tokenize" in vc
    assert "@@" not in vc and "@@" in pg and "<&>" not in pg
    for sql in (vc, pg):
        _compile(admin_engine, f"declare r record; begin for r in {sql} loop null; end loop; end")


def test_an_unknown_index_tier_is_refused() -> None:
    from orchestrator.recall.statement import StatementLimits, build_recall_statement

    with pytest.raises(ValueError, match="unknown index tier 'lucene'"):
        build_recall_statement(limits=StatementLimits(), index_tier="lucene")
