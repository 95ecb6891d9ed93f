"""Recall support: lexical corpus statistics and the title key the recall statement reads.

Why: the recall statement scores the lexical lane with true Okapi BM25, which
needs, per query, the document frequency of each query term, the corpus size N
and the average chunk length. Document frequencies come from the GIN-indexed
tsvectors at query time: every visible chunk that contains a query term is in
the lexical candidate set, so counting inside that set *is* the df over the
visible corpus. N and the total length are kept in ``recall.lexical_stats`` as
append-only deltas, one row per statement and scope set (statement-level
triggers with transition tables), so a write never updates a shared hot row;
a reader sums the deltas it may see. The rows carry the scope set of the chunks
they count and read with the same rule as chunks, so BM25 statistics are
computed over exactly the caller's visible corpus and scores cannot reveal
hidden documents. ``recall.compact_lexical_stats`` folds a tenant's deltas into
one row per scope set (a maintenance job runs it as ``engram_owner``).

The title lane matches a document whose complete title occurs in the question
(case- and accent-insensitive, on word boundaries). ``recall.title_key`` folds
text to lowercase unaccented words separated by single spaces; the statement
compares the keys of the question's word n-grams with an expression index on
the documents' title keys, so the lane is an index probe and never a scan of
every title. ``unaccent`` ships with PostgreSQL; it is created here if missing.

Revision ID: 0008_recall
Revises: 0007_embedding_models
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008_recall"
down_revision = "0007_embedding_models"
branch_labels = None
depends_on = None

FUNCTIONS_SQL = r"""
create function recall.title_key(p_text text) returns text
    language sql immutable strict parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select btrim(regexp_replace(lower(public.unaccent('public.unaccent'::regdictionary, p_text)),
                                '[^[:alnum:]]+', ' ', 'g'))
$$;
comment on function recall.title_key(text) is
    'Lowercase, unaccented words separated by single spaces: the key the title lane matches. '
    'Immutable because the unaccent dictionary is fixed per installation.';

-- security definer: every role that writes chunks (the app, the embedding
-- worker updating embeddings, cascades run as the owner) must keep the counts
-- right without holding any privilege on recall.lexical_stats; the function
-- only appends counts derived from the transition tables.
create function recall.tg_chunks__lexical_stats() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
as $$
begin
    -- One delta row per (tenant, scope set) and statement: writers append, nobody
    -- updates a shared counter row. An update that changes neither scopes nor
    -- lengths (an embedding written) nets to zero and appends nothing.
    if tg_op = 'INSERT' then
        insert into recall.lexical_stats (tenant_id, scopes, chunks, tokens)
        select n.tenant_id, n.scopes, count(*), sum(n.token_count)
          from new_rows n
         group by n.tenant_id, n.scopes;
    elsif tg_op = 'DELETE' then
        insert into recall.lexical_stats (tenant_id, scopes, chunks, tokens)
        select o.tenant_id, o.scopes, -count(*), -sum(o.token_count)
          from old_rows o
         group by o.tenant_id, o.scopes;
    else
        insert into recall.lexical_stats (tenant_id, scopes, chunks, tokens)
        select d.tenant_id, d.scopes, sum(d.chunks), sum(d.tokens)
          from (select n.tenant_id, n.scopes, 1 as chunks, n.token_count::bigint as tokens
                  from new_rows n
                union all
                select o.tenant_id, o.scopes, -1, -o.token_count::bigint
                  from old_rows o) d
         group by d.tenant_id, d.scopes
        having sum(d.chunks) <> 0 or sum(d.tokens) <> 0;
    end if;
    return null;
end
$$;
comment on function recall.tg_chunks__lexical_stats() is
    'Appends the change in chunk count and total lexical length per scope set.';

create trigger tg_chunks__lexical_stats_insert after insert on sources.chunks
    referencing new table as new_rows
    for each statement execute function recall.tg_chunks__lexical_stats();
create trigger tg_chunks__lexical_stats_delete after delete on sources.chunks
    referencing old table as old_rows
    for each statement execute function recall.tg_chunks__lexical_stats();
create trigger tg_chunks__lexical_stats_update after update on sources.chunks
    referencing old table as old_rows new table as new_rows
    for each statement execute function recall.tg_chunks__lexical_stats();

-- No foreign key to auth.tenants: deleting a tenant cascades to its chunks,
-- whose delete trigger appends deltas for the tenant being deleted, which a
-- foreign key would refuse. This trigger, deferred to commit so it runs after
-- every cascade, removes a deleted tenant's statistics instead.
create function recall.tg_tenants__purge_lexical_stats() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
as $$
begin
    delete from recall.lexical_stats s where s.tenant_id = old.id;
    return null;
end
$$;
comment on function recall.tg_tenants__purge_lexical_stats() is
    'Removes the BM25 statistics of deleted tenants (security definer: DBAs hold no grant on them).';

create constraint trigger tg_tenants__purge_lexical_stats after delete on auth.tenants
    deferrable initially deferred
    for each row execute function recall.tg_tenants__purge_lexical_stats();

create function recall.compact_lexical_stats(p_tenant uuid) returns integer
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_rows integer;
begin
    with gone as (
        delete from recall.lexical_stats s where s.tenant_id = p_tenant
        returning s.scopes, s.chunks, s.tokens
    )
    insert into recall.lexical_stats (tenant_id, scopes, chunks, tokens)
    select p_tenant, g.scopes, sum(g.chunks), sum(g.tokens)
      from gone g group by g.scopes
    having sum(g.chunks) <> 0;
    get diagnostics v_rows = row_count;
    return v_rows;
end
$$;
comment on function recall.compact_lexical_stats(uuid) is
    'Maintenance: folds a tenant''s statistic deltas into one row per scope set; returns the rows kept.';
"""

POLICIES_SQL = """
alter table recall.lexical_stats enable row level security;
alter table recall.lexical_stats force row level security;

create policy lexical_stats__select_app on recall.lexical_stats for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()));
create policy lexical_stats__all_owner on recall.lexical_stats for all to engram_owner
    using (true) with check (true);

grant usage on schema recall to engram_app;
grant select on recall.lexical_stats to engram_app;
-- No write grant: rows are appended only by the chunk triggers (security definer).
grant execute on function recall.title_key(text) to engram_app;
revoke all on function recall.compact_lexical_stats(uuid) from public;

comment on table recall.lexical_stats is
    'Append-only deltas of chunk count and lexical length per scope set: BM25''s N and avgdl.';
comment on column recall.lexical_stats.scopes is
    'The scope set of the counted chunks; read with the chunks'' rule, so N covers the visible corpus.';
comment on column recall.lexical_stats.chunks is 'Change in the number of chunks (negative on delete).';
comment on column recall.lexical_stats.tokens is 'Change in the sum of chunks.token_count.';
comment on index sources.ix_documents_tenant_id_title_key is
    'The title lane''s probe: complete titles matched against the question''s word n-grams.';
"""


def upgrade() -> None:
    op.execute("reset role")
    op.execute("create extension if not exists unaccent schema public")
    op.execute("set role engram_owner")
    op.execute("create schema recall authorization engram_owner")
    op.execute("comment on schema recall is 'What the recall statement reads besides the domain tables.'")
    op.create_table(
        "lexical_stats",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), server_default=sa.text("auth.tenant_id()"), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(postgresql.UUID(as_uuid=True)), nullable=False),
        sa.Column("chunks", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_lexical_stats"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_lexical_stats_scopes_nonempty"),
        schema="recall",
    )
    op.execute(FUNCTIONS_SQL)
    op.execute(
        "create index ix_documents_tenant_id_title_key on sources.documents "
        "(tenant_id, recall.title_key(title))"
    )
    # Chunks written before this revision: one delta per tenant and scope set.
    op.execute(
        "insert into recall.lexical_stats (tenant_id, scopes, chunks, tokens) "
        "select c.tenant_id, c.scopes, count(*), sum(c.token_count) from sources.chunks c "
        "group by c.tenant_id, c.scopes"
    )
    op.execute(POLICIES_SQL)


def downgrade() -> None:
    op.execute("drop index if exists sources.ix_documents_tenant_id_title_key")
    op.execute("drop trigger if exists tg_chunks__lexical_stats_insert on sources.chunks")
    op.execute("drop trigger if exists tg_chunks__lexical_stats_delete on sources.chunks")
    op.execute("drop trigger if exists tg_chunks__lexical_stats_update on sources.chunks")
    op.execute("drop trigger if exists tg_tenants__purge_lexical_stats on auth.tenants")
    op.execute("drop schema recall cascade")
    # unaccent stays: other objects of the database may use it.
