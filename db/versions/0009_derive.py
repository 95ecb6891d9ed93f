"""Derived-memory jobs: lifecycle policies, per-document use, extraction records.

Why: the lifecycle sweep archives documents nobody has used for a while, per
collection. Two things were missing for it:

* ``memory.lifecycle_policies``: one row per ``(tenant, collection)`` saying
  after how many days without use a document of that collection is archived.
  Pinned documents are exempt (the sweep's rule, not the table's).
* ``memory.document_use``: when each document was last used. The usage ledger
  already records ``mark used`` feedback, but a ledger row is readable only by
  the user it records, so a sweep run by one user could never see that a
  colleague used a document yesterday. An AFTER INSERT trigger on the ledger
  folds each document use into this table (SECURITY DEFINER, like
  ``memory.aggregate_usage``: it writes a row the caller has no grant on).
  A reader sees a row only when they can read its document (the policy joins
  ``sources.documents`` under the caller's RLS), so last-use times never leak
  the existence of hidden documents.
* ``memory.extractions``: which chunk version (content hash) the entity
  extractor has read and what it wrote (entities, claims, quarantined claims).
  Claims are append-only statements, so without this record a second run
  would assert every claim again; with it a run skips unchanged chunks. It
  carries the chunk's scope set and the standard scoped policies.

Revision ID: 0009_derive
Revises: 0008_recall
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009_derive"
down_revision = "0008_recall"
branch_labels = None
depends_on = None

UUID = postgresql.UUID(as_uuid=True)
UUIDS = postgresql.ARRAY(postgresql.UUID(as_uuid=True))
TS = sa.DateTime(timezone=True)

SQL = r"""
create function memory.tg_lifecycle_policies__touch() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if new.tenant_id is distinct from old.tenant_id or new.collection is distinct from old.collection then
        raise exception 'a lifecycle policy cannot move to another tenant or collection' using errcode = '42501';
    end if;
    new.updated_at := now();
    new.updated_by := auth.user_id();
    return new;
end
$$;
comment on function memory.tg_lifecycle_policies__touch() is
    'Stamps who changed a lifecycle policy and when; refuses moving it.';
create trigger tg_lifecycle_policies__touch before update on memory.lifecycle_policies
    for each row execute function memory.tg_lifecycle_policies__touch();

-- SECURITY DEFINER: the caller may write the ledger but holds no grant on
-- document_use; the function only records that the ledger row's document was used.
create function memory.tg_usage_ledger__document_use() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
as $$
begin
    insert into memory.document_use as u (tenant_id, document_id, uses, last_used_at)
    values (new.tenant_id, new.item_id, 1, new.occurred_at)
    on conflict (tenant_id, document_id)
        do update set uses = u.uses + 1, last_used_at = greatest(u.last_used_at, excluded.last_used_at);
    return null;
end
$$;
comment on function memory.tg_usage_ledger__document_use() is
    'Folds a ledger row about a document into memory.document_use (last use, count). '
    'SECURITY DEFINER: writes a table the caller holds no grant on.';
revoke all on function memory.tg_usage_ledger__document_use() from public;
create trigger tg_usage_ledger__document_use after insert on memory.usage_ledger
    for each row when (new.item_table = 'sources.documents')
    execute function memory.tg_usage_ledger__document_use();

alter table memory.lifecycle_policies enable row level security;
alter table memory.lifecycle_policies force row level security;
create policy lifecycle_policies__select_app on memory.lifecycle_policies for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy lifecycle_policies__insert_app on memory.lifecycle_policies for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()));
create policy lifecycle_policies__update_app on memory.lifecycle_policies for update to engram_app
    using (tenant_id = (select auth.tenant_id())) with check (tenant_id = (select auth.tenant_id()));
create policy lifecycle_policies__delete_app on memory.lifecycle_policies for delete to engram_app
    using (tenant_id = (select auth.tenant_id()));
grant select, delete on memory.lifecycle_policies to engram_app;
grant insert (collection, archive_after_days) on memory.lifecycle_policies to engram_app;
grant update (archive_after_days) on memory.lifecycle_policies to engram_app;

alter table memory.document_use enable row level security;
alter table memory.document_use force row level security;
create policy document_use__select_app on memory.document_use for select to engram_app
    using (tenant_id = (select auth.tenant_id())
           and exists (select 1 from sources.documents d
                        where d.tenant_id = document_use.tenant_id and d.id = document_use.document_id));
create policy document_use__insert_owner on memory.document_use for insert to engram_owner
    with check (tenant_id = (select auth.tenant_id()));
create policy document_use__update_owner on memory.document_use for update to engram_owner
    using (tenant_id = (select auth.tenant_id())) with check (tenant_id = (select auth.tenant_id()));
create policy document_use__select_owner on memory.document_use for select to engram_owner
    using (tenant_id = (select auth.tenant_id()));
grant select on memory.document_use to engram_app;

alter table memory.extractions enable row level security;
alter table memory.extractions force row level security;
create policy extractions__select_app on memory.extractions for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()));
create policy extractions__insert_app on memory.extractions for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy extractions__update_app on memory.extractions for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()))
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy extractions__delete_app on memory.extractions for delete to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create trigger tg_extractions__scopes before insert or update on memory.extractions
    for each row execute function memory.tg_scoped__check();
grant select, delete on memory.extractions to engram_app;
grant insert (chunk_id, content_hash, scopes, model, entity_ids, claim_ids, quarantine_ids)
    on memory.extractions to engram_app;
grant update (content_hash, scopes, model, entity_ids, claim_ids, quarantine_ids, extracted_at)
    on memory.extractions to engram_app;
comment on table memory.extractions is
    'Which chunk version the entity extractor read and what it wrote; reruns skip unchanged chunks.';

comment on table memory.lifecycle_policies is
    'Per collection: archive a document after this many days without use (pinned ones are exempt).';
comment on table memory.document_use is
    'When each document was last used (from the usage ledger); readable with the document.';
"""


def upgrade() -> None:
    op.create_table(
        "lifecycle_policies",
        sa.Column("tenant_id", UUID, server_default=sa.text("auth.tenant_id()"), nullable=False),
        sa.Column("collection", sa.Text(), nullable=False),
        sa.Column("archive_after_days", sa.Integer(), nullable=False),
        sa.Column("updated_by", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=True),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "collection", name="pk_lifecycle_policies"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name="fk_lifecycle_policies_tenant_id_tenants",
                                ondelete="CASCADE"),
        sa.CheckConstraint("archive_after_days between 1 and 36500",
                           name="ck_lifecycle_policies_archive_after_days_range"),
        sa.CheckConstraint("length(collection) between 1 and 200", name="ck_lifecycle_policies_collection_length"),
        schema="memory",
    )
    op.create_table(
        "document_use",
        sa.Column("tenant_id", UUID, nullable=False),
        sa.Column("document_id", UUID, nullable=False),
        sa.Column("uses", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_used_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "document_id", name="pk_document_use"),
        sa.ForeignKeyConstraint(["tenant_id", "document_id"], ["sources.documents.tenant_id", "sources.documents.id"],
                                name="fk_document_use_tenant_id_document_id_documents", ondelete="CASCADE"),
        sa.CheckConstraint("uses >= 0", name="ck_document_use_uses_nonnegative"),
        schema="memory",
    )
    op.create_table(
        "extractions",
        sa.Column("tenant_id", UUID, server_default=sa.text("auth.tenant_id()"), nullable=False),
        sa.Column("chunk_id", UUID, nullable=False),
        sa.Column("content_hash", postgresql.BYTEA(), nullable=False),
        sa.Column("scopes", UUIDS, nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("entity_ids", UUIDS, server_default=sa.text("'{}'"), nullable=False),
        sa.Column("claim_ids", UUIDS, server_default=sa.text("'{}'"), nullable=False),
        sa.Column("quarantine_ids", UUIDS, server_default=sa.text("'{}'"), nullable=False),
        sa.Column("extracted_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "chunk_id", name="pk_extractions"),
        sa.ForeignKeyConstraint(["tenant_id", "chunk_id"], ["sources.chunks.tenant_id", "sources.chunks.id"],
                                name="fk_extractions_tenant_id_chunk_id_chunks", ondelete="CASCADE"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_extractions_scopes_nonempty"),
        sa.CheckConstraint("length(model) between 1 and 200", name="ck_extractions_model_length"),
        schema="memory",
    )
    op.execute(SQL)
    for table in ("memory.lifecycle_policies", "memory.document_use", "memory.extractions"):
        op.execute(sa.text("select provenance.attach_chain(cast(:t as regclass))").bindparams(t=table))


def downgrade() -> None:
    op.execute("drop trigger tg_usage_ledger__document_use on memory.usage_ledger")
    op.execute("drop function memory.tg_usage_ledger__document_use()")
    op.drop_table("extractions", schema="memory")
    op.drop_table("document_use", schema="memory")
    op.drop_table("lifecycle_policies", schema="memory")
    op.execute("drop function memory.tg_lifecycle_policies__touch()")
