"""Search indexes, with the index tier chosen here and recorded in the database.

Why: one query shape, two tiers. When the server has VectorChord (``vchord`` and
``vchord_bm25``, as in the docker image) the chunks get a vchordrq vector index
(prefilter on for the app role) and a BM25 index; otherwise pgvector HNSW
(cosine) and a GIN index on ``(tenant_id, lexical)``. The choice is made once,
at migration time, and stored in ``engram.installation`` so that the recall
statement and ``engram db status`` know which tier runs.

Both tiers use pgvector's types and distance operators. The app role gets
``hnsw.iterative_scan = relaxed_order`` so a filtered top-k never returns fewer
visible rows than asked for because invisible ones crowded the index's first
candidates.

Revision ID: 0003_index_tier
Revises: 0002_sources
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_index_tier"
down_revision = "0002_sources"
branch_labels = None
depends_on = None

# Statements run by the VectorChord tier, in order. Kept as data so that a test
# can compile them on servers without VectorChord.
VECTORCHORD_EXTENSIONS = (
    "create extension if not exists vchord cascade",
    "create extension if not exists pg_tokenizer cascade",
    "create extension if not exists vchord_bm25 cascade",
)
VECTORCHORD_DDL = (
    "select tokenizer_catalog.create_tokenizer('engram_bert', $$ model = \"bert_base_uncased\" $$)",
    "alter table sources.chunks add column bm25 bm25_catalog.bm25vector",
    "create index ix_chunks_embedding_vchordrq on sources.chunks using vchordrq "
    "(embedding vector_cosine_ops) with (options = $$\nresidual_quantization = true\n"
    "[build.internal]\nlists = []\n$$)",
    "create index ix_chunks_bm25 on sources.chunks using bm25 (bm25 bm25_catalog.bm25_ops)",
    "grant update (bm25) on sources.chunks to engram_app",
)
VECTORCHORD_ROLE_SETTINGS = (
    "vchordrq.prefilter = on",
)

PGVECTOR_DDL = (
    "create index ix_chunks_embedding_hnsw on sources.chunks using hnsw "
    "(embedding vector_cosine_ops) with (m = 16, ef_construction = 64)",
    "create index ix_chunks_tenant_id_lexical on sources.chunks using gin (tenant_id, lexical)",
)
PGVECTOR_ROLE_SETTINGS = (
    "hnsw.iterative_scan = relaxed_order",
    "hnsw.ef_search = 100",
)

# Indexes that depend on the tier: the model/schema drift check leaves them out.
TIER_INDEXES = frozenset({
    "ix_chunks_embedding_vchordrq", "ix_chunks_bm25",
    "ix_chunks_embedding_hnsw", "ix_chunks_tenant_id_lexical",
})


def _role_settings(settings: tuple[str, ...]) -> str:
    parts = []
    for setting in settings:
        name, value = (s.strip() for s in setting.split("=", 1))
        parts.append(
            "execute format('alter role engram_app in database %I set "
            f"{name} = %L', current_database(), '{value}');"
        )
    return "do $s$ begin " + " ".join(parts) + " end $s$"


def vectorchord_available(bind: sa.engine.Connection) -> bool:
    names = {row[0] for row in bind.execute(sa.text(
        "select name from pg_available_extensions where name in ('vchord', 'vchord_bm25', 'pg_tokenizer')"
    ))}
    return {"vchord", "vchord_bm25", "pg_tokenizer"} <= names


def upgrade() -> None:
    bind = op.get_bind()
    op.create_table(
        "installation",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_installation"),
        schema="engram",
    )
    op.execute("alter table engram.installation enable row level security")
    op.execute("alter table engram.installation force row level security")
    op.execute(
        "create policy installation__select_all on engram.installation for select "
        "to engram_app, engram_auditor, engram_dba using (true)"
    )
    op.execute(
        "create policy installation__all_owner on engram.installation for all "
        "to engram_owner using (true) with check (true)"
    )
    op.execute("grant usage on schema engram to engram_app, engram_auditor, engram_dba")
    op.execute("grant select on engram.installation to engram_app, engram_auditor, engram_dba")
    op.execute("comment on table engram.installation is 'Facts about this installation, e.g. the index tier.'")

    if vectorchord_available(bind):
        op.execute("reset role")
        for stmt in VECTORCHORD_EXTENSIONS:
            op.execute(stmt)
        op.execute("set role engram_owner")
        for stmt in VECTORCHORD_DDL:
            op.execute(stmt)
        role_settings = VECTORCHORD_ROLE_SETTINGS
        tier = "vectorchord"
    else:
        for stmt in PGVECTOR_DDL:
            op.execute(stmt)
        role_settings = PGVECTOR_ROLE_SETTINGS
        tier = "pgvector"
    # Per-role settings need the migrating superuser, not engram_owner.
    op.execute("reset role")
    op.execute("load 'vector'")
    op.execute(_role_settings(role_settings))
    op.execute("set role engram_owner")
    op.execute(
        sa.text("insert into engram.installation (key, value) values ('index_tier', :tier)")
        .bindparams(tier=tier)
    )


def downgrade() -> None:
    bind = op.get_bind()
    tier = bind.execute(sa.text("select value from engram.installation where key = 'index_tier'")).scalar()
    op.execute("reset role")
    op.execute("do $s$ begin execute format('alter role engram_app in database %I reset all', current_database()); end $s$")
    op.execute("set role engram_owner")
    if tier == "vectorchord":
        op.execute("drop index if exists sources.ix_chunks_bm25")
        op.execute("drop index if exists sources.ix_chunks_embedding_vchordrq")
        op.execute("alter table sources.chunks drop column if exists bm25")
    else:
        op.execute("drop index if exists sources.ix_chunks_embedding_hnsw")
        op.execute("drop index if exists sources.ix_chunks_tenant_id_lexical")
    op.drop_table("installation", schema="engram")
