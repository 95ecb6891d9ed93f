"""The VectorChord tier's lexical lane: chunks keep their BM25 vector; memory lanes iterate.

Why: 0003 gave the VectorChord tier a ``bm25`` column on ``sources.chunks`` and a
``vchord_bm25`` index on it, but nothing filled the column, so the recall
statement's lexical lane (which uses ``bm25 <&> to_bm25query(...)`` on that
tier) would find nothing. On that tier this revision adds a BEFORE trigger that
tokenizes each chunk's text with the ``engram_bert`` tokenizer, backfills the
chunks written so far (each backfilled row gets its chain event: its image
changed), and lets the application role use the two extension schemas.

On both tiers the knowledge and memory tables (0004, 0005, 0010) carry pgvector
HNSW indexes, whose filtered scans need ``hnsw.iterative_scan`` so invisible
rows never starve a small tenant's pool; 0003 set it for the app role on the
pgvector tier only, so it is set here for the VectorChord tier too.

The statements are kept as data so a test can compile them on a server without
VectorChord, as for 0003.

Revision ID: 0012_vectorchord_lexical
Revises: 0011_derive_jobs
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_vectorchord_lexical"
down_revision = "0011_derive_jobs"
branch_labels = None
depends_on = None

TOKENIZER = "engram_bert"

# Run as engram_owner on the VectorChord tier, in order.
VECTORCHORD_LEXICAL_DDL = (
    "grant usage on schema tokenizer_catalog, bm25_catalog to engram_app",
    f"""create function sources.tg_chunks__bm25() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    new.bm25 := cast(tokenizer_catalog.tokenize(new.text, '{TOKENIZER}') as bm25_catalog.bm25vector);
    return new;
end
$$""",
    "comment on function sources.tg_chunks__bm25() is "
    "'VectorChord tier: keeps chunks.bm25 (the BM25 index''s vector) equal to the tokenized text.'",
    "create trigger tg_chunks__bm25 before insert or update of text on sources.chunks "
    "for each row execute function sources.tg_chunks__bm25()",
)
# Run by the migrating superuser (FORCE RLS hides rows from the owner).
VECTORCHORD_BACKFILL = (
    f"update sources.chunks set bm25 = cast(tokenizer_catalog.tokenize(text, '{TOKENIZER}') "
    "as bm25_catalog.bm25vector) where bm25 is null",
)
VECTORCHORD_ROLE_SETTINGS = ("hnsw.iterative_scan = relaxed_order", "hnsw.ef_search = 100")


def _tier() -> str | None:
    return op.get_bind().execute(sa.text(
        "select value from engram.installation where key = 'index_tier'")).scalar()


def _role_settings(settings: tuple[str, ...], *, reset: bool = False) -> str:
    parts = []
    for setting in settings:
        name, value = (s.strip() for s in setting.split("=", 1))
        parts.append(
            "execute format('alter role engram_app in database %I "
            + (f"reset {name}', current_database());" if reset
               else f"set {name} = %L', current_database(), '{value}');"))
    return "do $s$ begin " + " ".join(parts) + " end $s$"


def upgrade() -> None:
    if _tier() != "vectorchord":
        return
    for stmt in VECTORCHORD_LEXICAL_DDL:
        op.execute(stmt)
    op.execute("reset role")
    for stmt in VECTORCHORD_BACKFILL:
        op.execute(stmt)
    op.execute(_role_settings(VECTORCHORD_ROLE_SETTINGS))
    op.execute("set role engram_owner")


def downgrade() -> None:
    if _tier() != "vectorchord":
        return
    op.execute("drop trigger if exists tg_chunks__bm25 on sources.chunks")
    op.execute("drop function if exists sources.tg_chunks__bm25()")
    op.execute("reset role")
    op.execute(_role_settings(VECTORCHORD_ROLE_SETTINGS, reset=True))
    op.execute("revoke usage on schema tokenizer_catalog, bm25_catalog from engram_app")
    op.execute("set role engram_owner")
