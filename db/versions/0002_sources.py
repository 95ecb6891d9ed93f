"""Sources: documents and their chunks, under forced row level security.

Why: documents are the corpus every recall lane reads. A document's identity is
``(tenant, collection, path)``; it is shared into one or more scopes. A chunk
carries a copy of its document's scope set (kept equal by trigger) so that the
vector and lexical index scans can filter visibility inside the scan: a chunk
is readable exactly when its document is, and a chunk write needs write on the
chunk's complete scope set.

Read  = the caller holds read (or write) on at least one of the row's scopes.
Write = the caller holds write on every one of the row's scopes.

Revision ID: 0002_sources
Revises: 0001_roles_and_auth
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

revision = "0002_sources"
down_revision = "0001_roles_and_auth"
branch_labels = None
depends_on = None

EMBEDDING_DIMENSION = 384

TRIGGERS_SQL = r"""
create function sources.tg_documents__normalize() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op = 'UPDATE' and new.tenant_id is distinct from old.tenant_id then
        raise exception 'a document cannot move to another tenant' using errcode = '42501';
    end if;
    new.scopes := auth.check_scopes(new.tenant_id, new.scopes);
    new.content_hash := sha256(convert_to(new.body, 'UTF8'));
    if tg_op = 'UPDATE' then
        new.updated_at := now();
        new.created_at := old.created_at;
        if new.content_hash is distinct from old.content_hash then
            new.embed_state := 'pending';
        end if;
    end if;
    return new;
end
$$;
comment on function sources.tg_documents__normalize() is
    'Validates and sorts the scope set, computes the content hash, stamps updated_at.';

create trigger tg_documents__normalize before insert or update on sources.documents
    for each row execute function sources.tg_documents__normalize();

create function sources.tg_chunks__inherit() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_scopes uuid[];
begin
    if tg_op = 'UPDATE' and (new.tenant_id is distinct from old.tenant_id
                             or new.document_id is distinct from old.document_id) then
        raise exception 'a chunk cannot move to another document or tenant' using errcode = '42501';
    end if;
    select d.scopes into v_scopes from sources.documents d
     where d.tenant_id = new.tenant_id and d.id = new.document_id;
    if v_scopes is null then
        raise exception 'document % does not exist or is not visible', new.document_id
            using errcode = '23503';
    end if;
    new.scopes := v_scopes;
    new.content_hash := sha256(convert_to(new.text, 'UTF8'));
    new.lexical := to_tsvector('english'::regconfig, new.text);
    new.token_count := coalesce(
        (select sum(coalesce(array_length(l.positions, 1), 1))::integer from unnest(new.lexical) as l), 0);
    if tg_op = 'UPDATE' and new.content_hash is distinct from old.content_hash then
        new.embedding := null;
        new.embed_state := 'pending';
    end if;
    return new;
end
$$;
comment on function sources.tg_chunks__inherit() is
    'Copies the document''s scope set onto the chunk, computes hash, lexical vector and length.';

create trigger tg_chunks__inherit before insert or update on sources.chunks
    for each row execute function sources.tg_chunks__inherit();

create function sources.tg_documents__propagate_scopes() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    update sources.chunks c set scopes = new.scopes
     where c.tenant_id = new.tenant_id and c.document_id = new.id;
    return null;
end
$$;
comment on function sources.tg_documents__propagate_scopes() is
    'Keeps every chunk''s scope set equal to its document''s.';

create trigger tg_documents__propagate_scopes after update of scopes on sources.documents
    for each row when (old.scopes is distinct from new.scopes)
    execute function sources.tg_documents__propagate_scopes();
"""

POLICIES_SQL = """
alter table sources.documents enable row level security;
alter table sources.documents force row level security;
alter table sources.chunks enable row level security;
alter table sources.chunks force row level security;

create policy documents__select_app on sources.documents for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()));
create policy documents__insert_app on sources.documents for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy documents__update_app on sources.documents for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()))
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy documents__delete_app on sources.documents for delete to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));

create policy chunks__select_app on sources.chunks for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()));
create policy chunks__insert_app on sources.chunks for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy chunks__update_app on sources.chunks for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()))
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy chunks__delete_app on sources.chunks for delete to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));

grant usage on schema sources to engram_app;
grant usage on type sources.embed_state to engram_app;
grant select, delete on sources.documents, sources.chunks to engram_app;
grant insert (collection, path, title, kind, state, area, body, scopes, author, metadata,
              pinned, snoozed_until, archived_at)
    on sources.documents to engram_app;
grant update (title, kind, state, area, body, scopes, metadata, pinned, snoozed_until,
              archived_at, embed_state)
    on sources.documents to engram_app;
grant insert (document_id, ordinal, text, char_start, char_end)
    on sources.chunks to engram_app;
-- scopes is updatable only so the propagation trigger (security invoker) can run;
-- tg_chunks__inherit overwrites any value written with the document's scope set.
grant update (text, char_start, char_end, scopes, embedding, embed_state, embed_attempts,
              embed_error, embed_model, embedded_at)
    on sources.chunks to engram_app;

create view sources.current_documents with (security_barrier = true, security_invoker = true) as
    select d.tenant_id, d.id, d.collection, d.path, d.title, d.kind, d.state, d.area, d.body,
           d.content_hash, d.scopes, d.author, d.created_at, d.updated_at, d.pinned,
           d.snoozed_until, d.metadata
      from sources.documents d
     where d.archived_at is null and (d.snoozed_until is null or d.snoozed_until <= now());
grant select on sources.current_documents to engram_app;

comment on view sources.current_documents is
    'Documents that are neither archived nor snoozed; reads through the caller''s RLS.';
comment on table sources.documents is
    'The corpus: identity (tenant, collection, path), shared into one or more scopes.';
comment on table sources.chunks is
    'Spans of a document with lexical vector and embedding; readable exactly when the document is.';
comment on column sources.chunks.scopes is 'Copy of the document''s scope set (trigger-maintained).';
comment on column sources.documents.state is 'Explicit project state; only Active/Waiting appear in the Project catalog.';
"""


def upgrade() -> None:
    op.execute("create schema sources authorization engram_owner")
    op.execute("comment on schema sources is 'Documents and chunks.'")
    embed_state = postgresql.ENUM("pending", "ready", "failed", name="embed_state", schema="sources")
    embed_state.create(op.get_bind())
    state_enum = postgresql.ENUM(name="embed_state", schema="sources", create_type=False)

    op.create_table(
        "documents",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), server_default=sa.text("auth.tenant_id()"), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("collection", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), server_default=sa.text("'note'"), nullable=False),
        sa.Column("state", sa.Text(), nullable=True),
        sa.Column("area", sa.Text(), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("content_hash", postgresql.BYTEA(), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(postgresql.UUID(as_uuid=True)), nullable=False),
        sa.Column("author", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=True),
        sa.Column("metadata", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("pinned", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("snoozed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("embed_state", state_enum, server_default=sa.text("'pending'"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_documents"),
        sa.UniqueConstraint("tenant_id", "collection", "path", name="uq_documents_tenant_id_collection_path"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name="fk_documents_tenant_id_tenants", ondelete="CASCADE"),
        sa.CheckConstraint("length(collection) between 1 and 200", name="ck_documents_collection_length"),
        sa.CheckConstraint("length(path) between 1 and 1000", name="ck_documents_path_length"),
        sa.CheckConstraint("length(title) between 1 and 500", name="ck_documents_title_length"),
        sa.CheckConstraint("length(kind) between 1 and 50", name="ck_documents_kind_length"),
        sa.CheckConstraint(
            "state is null or state in ('Active', 'Waiting', 'Done', 'Someday', 'Cancelled', 'Archived')",
            name="ck_documents_state_known",
        ),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_documents_scopes_nonempty"),
        sa.CheckConstraint("jsonb_typeof(metadata) = 'object'", name="ck_documents_metadata_object"),
        schema="sources",
    )
    op.create_index("ix_documents_tenant_id_kind_state", "documents", ["tenant_id", "kind", "state"], schema="sources")
    op.create_index("ix_documents_tenant_id_content_hash", "documents", ["tenant_id", "content_hash"], schema="sources")

    op.create_table(
        "chunks",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), server_default=sa.text("auth.tenant_id()"), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("document_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("char_start", sa.Integer(), nullable=False),
        sa.Column("char_end", sa.Integer(), nullable=False),
        sa.Column("content_hash", postgresql.BYTEA(), nullable=False),
        sa.Column("lexical", postgresql.TSVECTOR(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(postgresql.UUID(as_uuid=True)), nullable=False),
        sa.Column("embedding", Vector(EMBEDDING_DIMENSION), nullable=True),
        sa.Column("embed_state", state_enum, server_default=sa.text("'pending'"), nullable=False),
        sa.Column("embed_attempts", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("embed_error", sa.Text(), nullable=True),
        sa.Column("embed_model", sa.Text(), nullable=True),
        sa.Column("embedded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_chunks"),
        sa.UniqueConstraint("tenant_id", "document_id", "ordinal", name="uq_chunks_tenant_id_document_id_ordinal"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "document_id"], ["sources.documents.tenant_id", "sources.documents.id"],
            name="fk_chunks_tenant_id_document_id_documents", ondelete="CASCADE",
        ),
        sa.CheckConstraint("ordinal >= 0", name="ck_chunks_ordinal_nonnegative"),
        sa.CheckConstraint("char_start >= 0 and char_end >= char_start", name="ck_chunks_offsets_ordered"),
        sa.CheckConstraint("length(text) >= 1", name="ck_chunks_text_nonempty"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_chunks_scopes_nonempty"),
        sa.CheckConstraint("embed_attempts >= 0", name="ck_chunks_embed_attempts_nonnegative"),
        sa.CheckConstraint(
            "(embed_state = 'ready') = (embedding is not null)", name="ck_chunks_embedding_matches_state"
        ),
        schema="sources",
    )
    op.create_index("ix_chunks_tenant_id_content_hash", "chunks", ["tenant_id", "content_hash"], schema="sources")
    op.create_index(
        "ix_chunks_embed_queue", "chunks", ["created_at"], schema="sources",
        postgresql_where=sa.text("embed_state = 'pending'"),
    )
    op.execute(TRIGGERS_SQL)
    op.execute(POLICIES_SQL)


def downgrade() -> None:
    op.execute("drop schema sources cascade")
