"""The active embedding model gets a generation; every model its text prefixes.

Why: a model change must never mix a question embedded by one model with stored
vectors of another. 0007 keeps one active model per installation, but nothing
told a running process that it changed.

* ``worker.embedding_models.generation``: raised by a trigger every time a model
  becomes active (the one-active index keeps it to one row). The recall
  statement returns the active generation, read in its own snapshot, so a
  recaller that embedded the question under another model sees it in the same
  round trip, throws the rows away unserved and switches models
  (``orchestrator/recall/service.py``). A counter rather than ``activated_at``:
  it is what a cache of query embeddings keys by, and it never repeats.
* ``query_prefix``, ``passage_prefix``: how a model wants its texts introduced
  (E5's ``"query: "``). Every process that loads a model by its registry name
  (a recaller switching, a backfill, a worker following a flip) formats texts
  as the others did, so no process embeds the same model two ways.

``engram_dba`` registers models (``engram models backfill`` does it for a new
name) and so may now insert the prefixes; nobody may update them: a model's
prefixes are part of its vectors.

Revision ID: 0080_model_generations
Revises: 0022_entity_resolution_within
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0080_model_generations"
down_revision = "0022_entity_resolution_within"
branch_labels = None
depends_on = None

TRIGGER_SQL = r"""
create function worker.tg_embedding_models__generation() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    -- Serialised by the one-active index: a second activation waits for the first.
    new.generation := (select coalesce(max(m.generation), 0) + 1 from worker.embedding_models m);
    new.activated_at := now();
    return new;
end
$$;
comment on function worker.tg_embedding_models__generation() is
    'Gives a model that becomes active the next generation (and stamps activated_at).';

create trigger tg_embedding_models__generation_insert before insert on worker.embedding_models
    for each row when (new.active) execute function worker.tg_embedding_models__generation();
create trigger tg_embedding_models__generation_update before update on worker.embedding_models
    for each row when (new.active and not old.active)
    execute function worker.tg_embedding_models__generation();

grant insert (query_prefix, passage_prefix) on worker.embedding_models to engram_dba;

comment on column worker.embedding_models.generation is
    'Raised each time a model becomes active: what recall compares and query caches key by.';
comment on column worker.embedding_models.query_prefix is
    'Put before every question this model embeds (e.g. "query: " for E5).';
comment on column worker.embedding_models.passage_prefix is
    'Put before every stored text this model embeds (e.g. "passage: " for E5).';
"""


def upgrade() -> None:
    op.add_column("embedding_models", sa.Column("generation", sa.BigInteger(),
                                                server_default=sa.text("0"), nullable=False),
                  schema="worker")
    for column in ("query_prefix", "passage_prefix"):
        op.add_column("embedding_models", sa.Column(column, sa.Text(), server_default=sa.text("''"),
                                                    nullable=False), schema="worker")
        op.create_check_constraint(f"ck_embedding_models_{column}_length", "embedding_models",
                                   f"length({column}) <= 200", schema="worker")
    op.execute(TRIGGER_SQL)
    op.execute("update worker.embedding_models set generation = 1 where active")


def downgrade() -> None:
    op.execute("drop trigger tg_embedding_models__generation_insert on worker.embedding_models")
    op.execute("drop trigger tg_embedding_models__generation_update on worker.embedding_models")
    op.execute("drop function worker.tg_embedding_models__generation()")
    for column in ("passage_prefix", "query_prefix", "generation"):
        op.drop_column("embedding_models", column, schema="worker")
