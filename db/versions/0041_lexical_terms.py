"""BM25 document frequencies kept per scope set, so the lexical lane scores a bounded set of rows.

Why: the lexical lane (0008) counted each query term's document frequency inside its
candidate set, which therefore had to be *every* visible chunk that holds *any* query
term: on a 90k-chunk tenant a question of common words matched most of the tenant, and
the lane alone took 111 ms (benchmarks/recall_latency.py at 300k chunks, docs/recall.md),
under RLS a per-row visibility test for each of them (the 1.16 RLS ratio).

Now ``recall.lexical_terms`` keeps, per tenant, scope set and lexeme, how many chunks hold
the lexeme, as ``recall.lexical_stats`` keeps N and the total length (0008): append-only
deltas written by statement-level triggers on ``sources.chunks`` (no hot counter row a
writer waits for), read with the chunks' visibility rule, so the df a reader gets is the
sum over the scope sets it may see: exactly the df of its visible corpus, and a score
still cannot reveal a hidden document. A delta is written only for rows whose lexical
vector or scope set changed (an embedding written by the worker appends nothing).
``recall.compact_lexical_stats`` (re-created here) folds a tenant's term deltas too, in the
derive tick's ``compact_all_lexical_stats``; ``recall.tg_tenants__purge_lexical_stats``
(re-created) purges them with the tenant.

With df known before any chunk is read, the lane fetches the chunks of the rarest query
terms first, up to a budget of rows (``recall_lexical_rows``), and scores only those with
BM25 (tf from each chunk's own vector): exact whenever the query terms' dfs sum to the
budget or less, and otherwise bounded, the budget spent on the terms that carry the most
weight (see orchestrator/recall/lexical.py).

Revision ID: 0041_lexical_terms
Revises: 0040_receipt_batches
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0041_lexical_terms"
down_revision = "0040_receipt_batches"
branch_labels = None
depends_on = None

TRIGGER = r"""
-- security definer for the reason of 0008's tg_chunks__lexical_stats: every role that
-- writes chunks keeps the counts right without any privilege on the table.
create function recall.tg_chunks__lexical_terms() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op = 'INSERT' then
        insert into recall.lexical_terms (tenant_id, scopes, lexeme, chunks)
        select n.tenant_id, n.scopes, l.lexeme, count(*)
          from new_rows n cross join unnest(n.lexical) as l
         group by n.tenant_id, n.scopes, l.lexeme;
    elsif tg_op = 'DELETE' then
        insert into recall.lexical_terms (tenant_id, scopes, lexeme, chunks)
        select o.tenant_id, o.scopes, l.lexeme, -count(*)
          from old_rows o cross join unnest(o.lexical) as l
         group by o.tenant_id, o.scopes, l.lexeme;
    else
        -- Only rows whose terms or scope set changed: an embedding written changes neither.
        insert into recall.lexical_terms (tenant_id, scopes, lexeme, chunks)
        select d.tenant_id, d.scopes, d.lexeme, sum(d.chunks)
          from (select n.tenant_id, n.scopes, l.lexeme, 1 as chunks
                  from new_rows n join old_rows o on o.tenant_id = n.tenant_id and o.id = n.id
                 cross join unnest(n.lexical) as l
                 where o.lexical is distinct from n.lexical or o.scopes is distinct from n.scopes
                union all
                select o.tenant_id, o.scopes, l.lexeme, -1
                  from old_rows o join new_rows n on n.tenant_id = o.tenant_id and n.id = o.id
                 cross join unnest(o.lexical) as l
                 where o.lexical is distinct from n.lexical or o.scopes is distinct from n.scopes) d
         group by d.tenant_id, d.scopes, d.lexeme
        having sum(d.chunks) <> 0;
    end if;
    return null;
end
$$;
comment on function recall.tg_chunks__lexical_terms() is
    'Appends, per scope set and lexeme, the change in the number of chunks holding the lexeme.';

create trigger tg_chunks__lexical_terms_insert after insert on sources.chunks
    referencing new table as new_rows
    for each statement execute function recall.tg_chunks__lexical_terms();
create trigger tg_chunks__lexical_terms_delete after delete on sources.chunks
    referencing old table as old_rows
    for each statement execute function recall.tg_chunks__lexical_terms();
create trigger tg_chunks__lexical_terms_update after update on sources.chunks
    referencing old table as old_rows new table as new_rows
    for each statement execute function recall.tg_chunks__lexical_terms();
"""

# 0008's compaction and purge, as 0008 made them (for the downgrade).
MAINTENANCE_0008 = r"""
create or replace function recall.compact_lexical_stats(p_tenant uuid) returns integer
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

create or replace function recall.tg_tenants__purge_lexical_stats() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
as $$
begin
    delete from recall.lexical_stats s where s.tenant_id = old.id;
    return null;
end
$$;
"""

# 0008's compaction and purge, each now also over the term statistics.
MAINTENANCE = (MAINTENANCE_0008
               .replace("""    get diagnostics v_rows = row_count;
    return v_rows;""", """    get diagnostics v_rows = row_count;
    with gone as (
        delete from recall.lexical_terms t where t.tenant_id = p_tenant
        returning t.scopes, t.lexeme, t.chunks
    )
    insert into recall.lexical_terms (tenant_id, scopes, lexeme, chunks)
    select p_tenant, g.scopes, g.lexeme, sum(g.chunks)
      from gone g group by g.scopes, g.lexeme
    having sum(g.chunks) <> 0;
    return v_rows;""")
               .replace("""    'Maintenance: folds a tenant''s statistic deltas into one row per scope set; returns the rows kept.';""",
                        """    'Maintenance: folds a tenant''s statistic deltas (N and length per scope set, df per scope '
    'set and lexeme) into one row each; returns the rows of N and length kept.';""")
               .replace("""    delete from recall.lexical_stats s where s.tenant_id = old.id;
    return null;""", """    delete from recall.lexical_stats s where s.tenant_id = old.id;
    delete from recall.lexical_terms t where t.tenant_id = old.id;
    return null;"""))
assert MAINTENANCE != MAINTENANCE_0008

POLICIES = """
alter table recall.lexical_terms enable row level security;
alter table recall.lexical_terms force row level security;
create policy lexical_terms__select_app on recall.lexical_terms for select to engram_app
    using (tenant_id = (select auth.tenant_id())
           and pg_catalog.arrayoverlap(scopes, (select auth.read_scopes())));
create policy lexical_terms__all_owner on recall.lexical_terms for all to engram_owner
    using (true) with check (true);
grant select on recall.lexical_terms to engram_app;
-- No write grant: rows are appended only by the chunk triggers (security definer).
comment on table recall.lexical_terms is
    'Append-only deltas of BM25 document frequency per scope set and lexeme (chunks holding it).';
comment on column recall.lexical_terms.scopes is
    'The scope set of the counted chunks; read with the chunks'' rule, so df covers the visible corpus.';
comment on column recall.lexical_terms.chunks is 'Change in the number of chunks holding the lexeme.';
comment on index recall.ix_lexical_terms_tenant_id_lexeme is
    'The lexical lane reads the df of each query term: one probe per term.';
"""


def upgrade() -> None:
    op.create_table(
        "lexical_terms",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), server_default=sa.text("auth.tenant_id()"),
                  nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(postgresql.UUID(as_uuid=True)), nullable=False),
        sa.Column("lexeme", sa.Text(), nullable=False),
        sa.Column("chunks", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_lexical_terms"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_lexical_terms_scopes_nonempty"),
        schema="recall",
    )
    op.create_index("ix_lexical_terms_tenant_id_lexeme", "lexical_terms", ["tenant_id", "lexeme"],
                    schema="recall", postgresql_include=["scopes", "chunks"])
    op.execute(TRIGGER)
    op.execute(MAINTENANCE)
    # Chunks written before this revision: one row per tenant, scope set and lexeme. As the
    # migrating superuser: under the chunks' forced RLS the owner, with no identity bound,
    # sees none of them.
    op.execute("reset role")
    op.execute("insert into recall.lexical_terms (tenant_id, scopes, lexeme, chunks) "
               "select c.tenant_id, c.scopes, l.lexeme, count(*) from sources.chunks c "
               "cross join unnest(c.lexical) as l group by c.tenant_id, c.scopes, l.lexeme")
    op.execute("set role engram_owner")
    op.execute(POLICIES)


def downgrade() -> None:
    for event in ("insert", "delete", "update"):
        op.execute(f"drop trigger tg_chunks__lexical_terms_{event} on sources.chunks")
    op.execute("drop function recall.tg_chunks__lexical_terms()")
    op.execute(MAINTENANCE_0008)
    op.drop_table("lexical_terms", schema="recall")
