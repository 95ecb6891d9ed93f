"""Embedding model registry, the embedding queue's bookkeeping and the worker role.

Why: rows are the embedding queue (``embed_state`` and friends live on each
embeddable table), but three things belong to the worker itself:

* ``worker.embedding_models``: which model the stored vectors come from (name,
  dimension, active). Exactly one model is active; vectors written by the
  worker are tagged with its name in ``embed_model``. Installation-wide, so no
  tenant_id, yet RLS is forced with explicit policies like every table.
* ``worker.embedding_cache``: per tenant and model, the vector of every content
  hash ever embedded. The worker looks a hash up here before it calls the
  model, so a text embedded once under a model is never embedded again (the
  same chunk text in two documents, a re-ingested document, a re-queued row).
  Per tenant, so one tenant's texts can never be inferred from another's.
* ``worker.embed_retries``: when a row's embedding failed, the earliest time it
  may be tried again (exponential backoff) and why it failed; the row itself
  keeps ``embed_attempts`` and ``embed_error``. Kept apart so that the queue
  needs no extra column on every embeddable table.

``engram_worker`` is the role the worker process logs in as. It serves every
tenant, so it cannot be ``engram_app`` bound to one; instead its reach is cut by
column grants: on an embeddable table it reads the text, hash and queue columns
and updates only the embedding columns; it can neither insert nor delete there,
and reads no other table, except the columns the tables' own security-invoker
triggers read while the worker updates a row: ``sources.documents (tenant_id,
id, scopes)`` for chunks and ``auth.scopes (tenant_id, id)`` for the scoped
memory tables.

``worker.make_embeddable(table, read_columns)`` applies that pattern (grants,
policies, the NOTIFY trigger) to a table; a domain that adds an embeddable table
calls it once in its revision and adds one line to
``orchestrator/worker/queue.py``'s ``EMBEDDABLE``.

The NOTIFY trigger sends ``engram_embed`` with the table's name whenever a row
becomes pending, so idle workers wake at once; they also poll, so a lost
notification only delays work.

Revision ID: 0007_embedding_models
Revises: 0006_provenance
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

revision = "0007_embedding_models"
down_revision = "0006_provenance"
branch_labels = None
depends_on = None

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDABLE_TABLES = (
    "sources.chunks", "knowledge.fact_content", "memory.working_memory", "memory.profiles",
    "memory.episodes", "memory.observations", "memory.communities", "memory.raptor_nodes",
)
DEFAULT_DIMENSION = 384

ROLE_SQL = """
do $roles$
begin
    if not exists (select 1 from pg_roles where rolname = 'engram_worker') then
        create role engram_worker login nobypassrls nocreatedb nocreaterole noinherit;
    end if;
end
$roles$;
comment on role engram_worker is
    'The embedding worker: LOGIN, no BYPASSRLS, owns nothing; reads texts to embed, writes vectors.';
"""

FUNCTIONS_SQL = r"""
create function worker.tg_embeddable__notify() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    -- One notification per table and transaction: PostgreSQL folds identical ones.
    perform pg_notify('engram_embed', tg_table_schema || '.' || tg_table_name);
    return null;
end
$$;
comment on function worker.tg_embeddable__notify() is
    'Wakes listening embedding workers (channel engram_embed, payload schema.table).';

create function worker.make_embeddable(p_table regclass, p_read_columns text[]) returns void
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_schema text;
    v_name text;
begin
    select n.nspname, c.relname into v_schema, v_name
      from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.oid = p_table;
    execute format('grant usage on schema %I to engram_worker', v_schema);
    execute format('grant select (%s) on %s to engram_worker',
                   (select string_agg(quote_ident(c), ', ') from unnest(p_read_columns) as c),
                   p_table);
    execute format('grant update (embedding, embed_state, embed_attempts, embed_error, '
                   'embed_model, embedded_at) on %s to engram_worker', p_table);
    execute format('create policy %I on %s for select to engram_worker using (true)',
                   v_name || '__select_worker', p_table);
    execute format('create policy %I on %s for update to engram_worker using (true) '
                   'with check (true)', v_name || '__update_worker', p_table);
    execute format('create trigger %I after insert on %s for each row '
                   'when (new.embed_state = ''pending'') '
                   'execute function worker.tg_embeddable__notify()',
                   'tg_' || v_name || '__notify_embed_insert', p_table);
    execute format('create trigger %I after update on %s for each row '
                   'when (new.embed_state = ''pending'' and old.embed_state <> ''pending'') '
                   'execute function worker.tg_embeddable__notify()',
                   'tg_' || v_name || '__notify_embed_update', p_table);
end
$$;
comment on function worker.make_embeddable(regclass, text[]) is
    'Migration helper: lets engram_worker read p_read_columns and write the embedding columns '
    'of a table, and makes pending rows NOTIFY engram_embed.';
revoke all on function worker.make_embeddable(regclass, text[]) from public;
"""

POLICIES_SQL = """
alter table worker.embedding_models enable row level security;
alter table worker.embedding_models force row level security;
alter table worker.embedding_cache enable row level security;
alter table worker.embedding_cache force row level security;
alter table worker.embed_retries enable row level security;
alter table worker.embed_retries force row level security;

create policy embedding_models__select_all on worker.embedding_models for select
    to engram_app, engram_worker, engram_auditor, engram_dba using (true);
create policy embedding_models__insert_dba on worker.embedding_models for insert
    to engram_dba with check (not active);
create policy embedding_models__update_worker on worker.embedding_models for update
    to engram_worker using (true) with check (true);
create policy embedding_models__all_owner on worker.embedding_models for all
    to engram_owner using (true) with check (true);

create policy embedding_cache__select_worker on worker.embedding_cache for select
    to engram_worker using (true);
create policy embedding_cache__insert_worker on worker.embedding_cache for insert
    to engram_worker with check (true);

create policy embed_retries__all_worker on worker.embed_retries for all
    to engram_worker using (true) with check (true);

grant usage on schema worker to engram_app, engram_worker, engram_auditor, engram_dba;
grant select on worker.embedding_models to engram_app, engram_worker, engram_auditor, engram_dba;
grant insert (name, dimension) on worker.embedding_models to engram_dba;
grant update (active, activated_at) on worker.embedding_models to engram_worker;
grant select, insert (tenant_id, model, content_hash, embedding) on worker.embedding_cache
    to engram_worker;
grant select, delete, insert (tenant_id, relation, row_key, retry_at, last_error),
      update (retry_at, last_error)
    on worker.embed_retries to engram_worker;

-- The chunk trigger (tg_chunks__inherit, security invoker) reads the document's scope
-- set on every chunk update, including the worker's; only those columns are granted.
grant usage on schema sources to engram_worker;
grant usage on type sources.embed_state to engram_worker;
grant select (tenant_id, id, scopes) on sources.documents to engram_worker;
create policy documents__select_worker on sources.documents for select
    to engram_worker using (true);
-- Derived-memory rows re-check their scope set on every update (memory.tg_scoped__check
-- calls auth.check_scopes, security invoker), the worker's updates included: scope ids
-- only, never names or descriptions.
grant usage on schema auth to engram_worker;
grant select (tenant_id, id) on auth.scopes to engram_worker;
create policy scopes__select_worker on auth.scopes for select to engram_worker using (true);
select worker.make_embeddable('sources.chunks',
    array['tenant_id', 'id', 'text', 'content_hash', 'embed_state', 'embed_attempts',
          'embed_model', 'created_at']);
-- The embeddable tables of 0004 (knowledge) and 0005 (memory), which run before this
-- revision; each row: table, text column, whether it stores its own content hash.
do $embeddable$
declare
    r record;
begin
    for r in select * from (values
        ('knowledge.fact_content', 'text', true),
        ('memory.working_memory', 'text', false),
        ('memory.profiles', 'summary', false),
        ('memory.episodes', 'summary', false),
        ('memory.observations', 'text', false),
        ('memory.communities', 'summary', false),
        ('memory.raptor_nodes', 'summary', false)) as v(tbl, col, has_hash)
    loop
        if to_regclass(r.tbl) is not null then
            perform worker.make_embeddable(r.tbl::regclass,
                array['tenant_id', 'id', r.col, 'embed_state', 'embed_attempts', 'embed_model',
                      'created_at'] || case when r.has_hash then array['content_hash'] else '{}' end);
        end if;
    end loop;
end
$embeddable$;

comment on table worker.embedding_models is
    'Embedding models the stored vectors may come from; exactly one is active.';
comment on column worker.embedding_models.active is
    'The model whose vectors recall reads and the worker writes.';
comment on table worker.embedding_cache is
    'Per tenant and model, the vector of each content hash already embedded (computation dedup).';
comment on table worker.embed_retries is
    'Backoff for rows whose embedding failed: not before retry_at; the last error.';
"""


def upgrade() -> None:
    op.execute("reset role")
    op.execute(ROLE_SQL)
    op.execute("set role engram_owner")
    op.execute("create schema worker authorization engram_owner")
    op.execute("comment on schema worker is 'The embedding worker: model registry, cache, retries.'")

    op.create_table(
        "embedding_models",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("dimension", sa.Integer(), nullable=False),
        sa.Column("active", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("activated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_embedding_models"),
        sa.CheckConstraint("length(name) between 1 and 200", name="ck_embedding_models_name_length"),
        sa.CheckConstraint("dimension between 1 and 16000", name="ck_embedding_models_dimension_range"),
        schema="worker",
    )
    op.create_index(
        "uq_embedding_models_one_active", "embedding_models", ["active"], unique=True,
        schema="worker", postgresql_where=sa.text("active"),
    )
    op.create_table(
        "embedding_cache",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("content_hash", postgresql.BYTEA(), nullable=False),
        sa.Column("embedding", Vector(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "model", "content_hash", name="pk_embedding_cache"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"],
                                name="fk_embedding_cache_tenant_id_tenants", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["model"], ["worker.embedding_models.name"],
                                name="fk_embedding_cache_model_embedding_models", ondelete="CASCADE"),
        schema="worker",
    )
    op.create_table(
        "embed_retries",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("relation", sa.Text(), nullable=False),
        sa.Column("row_key", sa.Text(), nullable=False),
        sa.Column("retry_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "relation", "row_key", name="pk_embed_retries"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"],
                                name="fk_embed_retries_tenant_id_tenants", ondelete="CASCADE"),
        schema="worker",
    )
    op.execute(FUNCTIONS_SQL)
    op.execute(POLICIES_SQL)
    op.execute(
        sa.text("insert into worker.embedding_models (name, dimension, active, activated_at) "
                "values (:n, :d, true, now())").bindparams(n=DEFAULT_MODEL, d=DEFAULT_DIMENSION)
    )


def downgrade() -> None:
    op.execute("set role engram_owner")
    for table in EMBEDDABLE_TABLES:
        schema, name = table.split(".")
        op.execute(f"""
do $undo$ begin
    if to_regclass('{table}') is not null then
        drop trigger if exists tg_{name}__notify_embed_insert on {table};
        drop trigger if exists tg_{name}__notify_embed_update on {table};
        drop policy if exists {name}__select_worker on {table};
        drop policy if exists {name}__update_worker on {table};
        revoke all on {table} from engram_worker;
        revoke all on schema {schema} from engram_worker;
    end if;
end $undo$""")
    op.execute("drop policy if exists documents__select_worker on sources.documents")
    op.execute("revoke all on sources.documents from engram_worker")
    op.execute("drop policy if exists scopes__select_worker on auth.scopes")
    op.execute("revoke all on auth.scopes from engram_worker")
    op.execute("revoke all on schema auth from engram_worker")
    op.execute("revoke all on type sources.embed_state from engram_worker")
    op.execute("revoke all on schema sources from engram_worker")
    op.execute("drop schema worker cascade")
    # The role is cluster-wide and may serve other databases: left in place, like 0001's.
