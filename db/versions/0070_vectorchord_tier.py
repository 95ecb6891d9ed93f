"""The VectorChord tier made true: the portable lexical lane, and a vchordrq index sized from the table.

Why: on the VectorChord tier the lexical lane used the ``vchord_bm25`` index (0003,
0012). That index keeps one set of BM25 statistics for the whole table, so its scores
mixed every tenant's (and every scope's) documents, and the recall statement had to hide
them: the lane emitted no score and no corpus-statistics row. Worse, the index returns at
most ``bm25_catalog.bm25_limit`` (100) rows before the tenant filter applies, so a small
tenant whose words are common in a large tenant's documents got no lexical candidates at
all. This revision gives that tier the portable lexical lane instead: the GIN index on
``(tenant_id, lexical)`` finds the tenant's matching chunks (tenant first, so no other
tenant's rows are ever read), and BM25 is scored in SQL from the matched tsvectors with
N and the average length from ``recall.lexical_stats`` over the caller's visible scope
sets. The trigger that tokenized every chunk for ``vchord_bm25`` and its index are
dropped; the ``bm25`` column stays (nullable, no longer written), because dropping it
would change every chunk's row image under the provenance chain.

The ``vchordrq`` index was built by 0003 on an empty table (``lists = []``); here it is
rebuilt with lists sized from the embedded chunks (the rule as of this revision is
frozen below; ``orchestrator/db/indexes.py`` carries the living copy that ``engram db
reindex`` applies as the table grows) and the application and
worker roles get ``vchordrq.probes`` to match.

On the pgvector tier nothing changes. The statements are kept as data so that a test can
compile them on a server without VectorChord.

Revision ID: 0070_vectorchord_tier
Revises: 0019_derivation_batches
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0070_vectorchord_tier"
down_revision = "0019_derivation_batches"
branch_labels = None
depends_on = None

VCHORDRQ_INDEX = "ix_chunks_embedding_vchordrq"


# The sizing rule as this revision applies it. A released revision must not read code that
# can still change, so it is frozen here rather than imported from orchestrator.db.indexes.
def vchordrq_lists(rows: int) -> int:
    return 0 if rows < 50_000 else round(4 * math.sqrt(rows))


def vchordrq_create(name: str, lists: int) -> str:
    return (f"create index {name} on sources.chunks using vchordrq (embedding vector_cosine_ops) "
            "with (options = $$\nresidual_quantization = true\n[build.internal]\n"
            f"lists = [{lists if lists else ''}]\n$$)")


def vchordrq_probe_settings(lists: int) -> list[str]:
    value = str(max(1, math.ceil(lists * 0.05))) if lists else ""
    return [f"do $s$ begin execute format('alter role {role} in database %I set vchordrq.probes = %L', "
            f"current_database(), '{value}'); end $s$" for role in ("engram_app", "engram_worker")]


# Run as engram_owner on the VectorChord tier, in order.
VECTORCHORD_TIER_DDL = (
    "drop trigger if exists tg_chunks__bm25 on sources.chunks",
    "drop function if exists sources.tg_chunks__bm25()",
    "drop index if exists sources.ix_chunks_bm25",
    "comment on column sources.chunks.bm25 is 'Unused since 0070 (the lexical lane is the "
    "portable one on every tier); kept so that existing rows keep their chain images.'",
    "create index ix_chunks_tenant_id_lexical on sources.chunks using gin (tenant_id, lexical)",
    f"drop index if exists sources.{VCHORDRQ_INDEX}",
)


def _sibling(name: str) -> ModuleType:
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tier() -> str | None:
    return op.get_bind().execute(sa.text(
        "select value from engram.installation where key = 'index_tier'")).scalar()


def _embedded_chunks() -> int:
    # As the migrating superuser: FORCE RLS hides every row from engram_owner.
    op.execute("reset role")
    rows = int(op.get_bind().execute(sa.text(
        "select count(*) from sources.chunks where embedding is not null")).scalar_one())
    op.execute("set role engram_owner")
    return rows


def upgrade() -> None:
    if _tier() != "vectorchord":
        return
    lists = vchordrq_lists(_embedded_chunks())
    for stmt in VECTORCHORD_TIER_DDL:
        op.execute(stmt)
    op.execute(vchordrq_create(VCHORDRQ_INDEX, lists))
    op.execute("reset role")
    for stmt in vchordrq_probe_settings(lists):
        op.execute(stmt)
    op.execute("set role engram_owner")


def downgrade() -> None:
    if _tier() != "vectorchord":
        return
    tier = _sibling("0003_index_tier.py")
    lexical = _sibling("0012_vectorchord_lexical.py")
    op.execute("drop index if exists sources.ix_chunks_tenant_id_lexical")
    op.execute(f"drop index if exists sources.{VCHORDRQ_INDEX}")
    for stmt in tier.VECTORCHORD_DDL:
        if "vchordrq" in stmt or "using bm25" in stmt:
            op.execute(stmt)
    for stmt in lexical.VECTORCHORD_LEXICAL_DDL:
        if "trigger" in stmt or "function" in stmt:
            op.execute(stmt)
    op.execute("comment on column sources.chunks.bm25 is null")
    op.execute("reset role")
    for stmt in lexical.VECTORCHORD_BACKFILL:
        op.execute(stmt)
    for role in ("engram_app", "engram_worker"):
        op.execute(f"do $s$ begin execute format('alter role {role} in database %I reset "
                   "vchordrq.probes', current_database()); end $s$")
    op.execute("set role engram_owner")
