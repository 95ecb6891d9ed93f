"""Embedding state that can only be true: dropped where nothing kept it, derived where asked.

Why: ``sources.documents.embed_state`` (0002) was set to ``pending`` on every
insert and body change, and nothing ever set it to anything else: the worker
embeds chunks, never documents. A client waiting for a document to be
"embedded" waited forever. ``knowledge.entities`` carried the embedding queue's
columns (0004) but is on no embedding queue (``worker.make_embeddable`` was
never called for it) and no recall lane reads an entity vector: its state, too,
stayed ``pending`` for ever.

Both are dropped rather than kept in step by triggers. A document's embedding
progress is a fact about its chunks, so it is derived from them when asked
(GraphQL ``Document.embedding``: chunks total, embedded, failed), always true
and costing nothing on the write path; keeping a copy on the document row would
make every embedding batch update (and chain) each document it touches and bump
its ``updated_at``, which recency ranking reads. An entity vector would cost a
model call per entity for no reader.

The triggers that wrote the dropped columns (``sources.tg_documents__normalize``,
``knowledge.tg_entities__normalize``) lose exactly those assignments: each is
patched in place from its catalog definition, checked to contain the lines first,
so that nothing else in 0002's and 0004's functions changes. The rows' images
change, so both tables are re-baselined, as 0010 does.

Revision ID: 0081_embedding_progress
Revises: 0080_model_generations
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

revision = "0081_embedding_progress"
down_revision = "0080_model_generations"
branch_labels = None
depends_on = None

# (function, the text just before the dropped lines, the dropped lines): unique in each.
PATCHES = (
    ("sources.tg_documents__normalize()",
     "        new.created_at := old.created_at;\n",
     "        if new.content_hash is distinct from old.content_hash then\n"
     "            new.embed_state := 'pending';\n"
     "        end if;\n"),
    ("knowledge.tg_entities__normalize()",
     "        new.updated_at := now();\n",
     "        if new.summary is distinct from old.summary or new.canonical_name is distinct "
     "from old.canonical_name then\n"
     "            new.embedding := null;\n"
     "            new.embed_state := 'pending';\n"
     "        end if;\n"),
)
ENTITY_COLUMNS = ("embedding", "embed_state", "embed_attempts", "embed_error", "embed_model",
                  "embedded_at")
CHANGED = ("sources.documents", "knowledge.entities")


def _patch(function: str, before: str, after: str) -> None:
    bind = op.get_bind()
    row = bind.execute(sa.text(
        "select pg_get_functiondef(cast(:f as regprocedure)) as definition"), {"f": function}).one()
    if before not in row.definition:
        raise RuntimeError(f"function {function} is not the one revision {revision} patches")
    # Sent as it is: the definition holds RAISE formats ('%') that are not parameters.
    cursor = bind.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(row.definition.replace(before, after))
    finally:
        cursor.close()


def _baseline() -> None:
    # Only the migrating superuser sees every row (FORCE RLS hides them from the owner).
    op.execute("reset role")
    for table in CHANGED:
        op.execute(sa.text("select provenance.baseline(cast(:t as regclass))").bindparams(t=table))
    op.execute("set role engram_owner")


def upgrade() -> None:
    for function, anchor, lines in PATCHES:
        _patch(function, anchor + lines, anchor)
    op.drop_column("documents", "embed_state", schema="sources")
    for column in ENTITY_COLUMNS:
        op.drop_column("entities", column, schema="knowledge")
    _baseline()


def downgrade() -> None:
    state = postgresql.ENUM(name="embed_state", schema="sources", create_type=False)
    op.add_column("documents", sa.Column("embed_state", state, server_default=sa.text("'pending'"),
                                         nullable=False), schema="sources")
    op.add_column("entities", sa.Column("embedding", Vector(384), nullable=True), schema="knowledge")
    op.add_column("entities", sa.Column("embed_state", state, server_default=sa.text("'pending'"),
                                        nullable=False), schema="knowledge")
    op.add_column("entities", sa.Column("embed_attempts", sa.SmallInteger(),
                                        server_default=sa.text("0"), nullable=False),
                  schema="knowledge")
    for column in ("embed_error", "embed_model"):
        op.add_column("entities", sa.Column(column, sa.Text(), nullable=True), schema="knowledge")
    op.add_column("entities", sa.Column("embedded_at", sa.DateTime(timezone=True), nullable=True),
                  schema="knowledge")
    op.create_check_constraint("ck_entities_embed_attempts_nonnegative", "entities",
                               "embed_attempts >= 0", schema="knowledge")
    op.create_check_constraint("ck_entities_embedding_matches_state", "entities",
                               "(embed_state = 'ready') = (embedding is not null)",
                               schema="knowledge")
    op.execute("grant update (embed_state) on sources.documents to engram_app")
    for function, anchor, lines in PATCHES:
        _patch(function, anchor, anchor + lines)
    _baseline()
