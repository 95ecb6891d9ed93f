"""BM25 document frequencies kept per scope set, so the lexical lane scores a bounded set of rows.

Why: the lexical lane (0008) counted each query term's document frequency inside its
candidate set, which therefore had to be *every* visible chunk that holds *any* query
term: on a 90k-chunk tenant a question of common words matched most of the tenant, and
the lane alone took 111 ms (benchmarks/recall_latency.py at 300k chunks, docs/recall.md),
under RLS a per-row visibility test for each of them (the 1.16 RLS ratio).

Now the database keeps, per tenant, scope set and lexeme, how many chunks hold the lexeme,
read with the chunks' visibility rule, so the df a reader gets is the sum over the scope
sets it may see: exactly the df of its visible corpus, and a score still cannot reveal a
hidden document. It is kept in two parts, because one row per lexeme written by each
chunk write halved the write rate of ``engram ingest`` (a 75-chunk file of prose holds some
3,000 distinct lexemes: 150-220 ms of row inserts in a 300 ms statement, measured):

* ``recall.lexical_term_deltas``: what the chunk triggers append, one row per statement,
  scope set and sign (the lexemes of the chunks written, +1, or removed, -1, each once per
  chunk holding it, in one array; an update appends only for rows whose terms or scope set
  changed, so an embedding written by the worker appends nothing): one insert and no
  grouping however many lexemes (10-20 ms for a 75-chunk file, where grouped per-lexeme
  arrays took 40-60 ms), and no hot counter row a writer waits for (as
  ``recall.lexical_stats``, 0008);
* ``recall.lexical_terms``: one row per tenant, lexeme and scope set, written only by
  ``recall.fold_lexical_terms`` (SECURITY DEFINER, ``engram_worker``), which folds a
  tenant's deltas into it in the background (the worker every few seconds, the derive
  tick, ``recall.compact_lexical_stats``) under a per-tenant lock.

A reader's df is the sum of both, so it is exact at any moment; folding only keeps the
deltas a reader unnests few. ``recall.tg_tenants__purge_lexical_stats`` (re-created)
purges both with the tenant.

With df known before any chunk is read, the lane fetches the chunks of the rarest query
terms first, up to a budget of rows (``recall_lexical_rows``), and scores only those with
BM25 (tf from each chunk's own vector): exact whenever the query terms' dfs sum to the
budget or less, and otherwise bounded, the budget spent on the terms that carry the most
weight (see ``orchestrator/recall/statement.py``, ``portable_lexical``).

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

# One delta row per (tenant, scope set) of {rows} (new_rows or old_rows, or {rows} filtered by
# {where}): every lexeme of every chunk, once per chunk holding it, and the sign of the change.
_DELTA = """
        insert into recall.lexical_term_deltas (tenant_id, scopes, sign, lexemes)
        select r.tenant_id, r.scopes, {sign}, array_agg(l.lexeme)
          from {rows} r cross join unnest(tsvector_to_array(r.lexical)) as l(lexeme){where}
         group by r.tenant_id, r.scopes;"""
# An update counts only chunks whose terms or scope set changed (an embedding written by
# the worker changes neither): out with the old, in with the new.
_CHANGED = """
         where exists (select 1 from {other} x where x.tenant_id = r.tenant_id and x.id = r.id
                          and (x.lexical is distinct from r.lexical or x.scopes is distinct from r.scopes))"""

TRIGGER = r"""
-- security definer for the reason of 0008's tg_chunks__lexical_stats: every role that
-- writes chunks keeps the counts right without any privilege on the tables. Grouping by
-- lexeme is left to the fold: here it is one unnest and one array per statement.
create function recall.tg_chunks__lexical_terms() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op = 'INSERT' then""" + _DELTA.format(rows="new_rows", sign="1", where="") + """
    elsif tg_op = 'DELETE' then""" + _DELTA.format(rows="old_rows", sign="-1", where="") + """
    else""" + _DELTA.format(rows="old_rows", sign="-1", where=_CHANGED.format(other="new_rows")) \
    + _DELTA.format(rows="new_rows", sign="1", where=_CHANGED.format(other="old_rows")) + """
    end if;
    return null;
end
$$;
comment on function recall.tg_chunks__lexical_terms() is
    'Appends, per statement and scope set, the lexemes of the chunks written (+1) or removed (-1).';

create trigger tg_chunks__lexical_terms_insert after insert on sources.chunks
    referencing new table as new_rows
    for each statement execute function recall.tg_chunks__lexical_terms();
create trigger tg_chunks__lexical_terms_delete after delete on sources.chunks
    referencing old table as old_rows
    for each statement execute function recall.tg_chunks__lexical_terms();
create trigger tg_chunks__lexical_terms_update after update on sources.chunks
    referencing old table as old_rows new table as new_rows
    for each statement execute function recall.tg_chunks__lexical_terms();

-- SECURITY DEFINER: only the owner writes the folded counts; the worker (and the derive
-- tick, and compact_lexical_stats) may ask for the deltas to be folded.
create function recall.fold_lexical_terms(p_min_deltas integer, p_tenant uuid default null)
    returns integer
    language plpgsql volatile security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid;
    v_done integer := 0;
begin
    for v_tenant in
        select d.tenant_id from recall.lexical_term_deltas d
         where p_tenant is null or d.tenant_id = p_tenant
         group by d.tenant_id having count(*) >= greatest(p_min_deltas, 1) order by 1
    loop
        -- One folder per tenant at a time; the deltas are read after the lock, so a folder
        -- that waited finds what the one before it folded gone.
        perform pg_advisory_xact_lock(hashtext('engram.lexical_terms'), hashtext(v_tenant::text));
        with gone as (
            delete from recall.lexical_term_deltas d where d.tenant_id = v_tenant
            returning d.scopes, d.sign, d.lexemes
        ), sums as (
            select g.scopes, l.lexeme, sum(g.sign) as n
              from gone g cross join unnest(g.lexemes) as l(lexeme)
             group by g.scopes, l.lexeme
            having sum(g.sign) <> 0
        ), folded as (
            insert into recall.lexical_terms as t (tenant_id, scopes, lexeme, chunks)
            select v_tenant, s.scopes, s.lexeme, s.n from sums s
            on conflict (tenant_id, lexeme, scopes) do update set chunks = t.chunks + excluded.chunks
            returning t.lexeme, t.scopes, t.chunks
        )
        delete from recall.lexical_terms t
         using folded f
         where t.tenant_id = v_tenant and t.lexeme = f.lexeme and t.scopes = f.scopes and f.chunks = 0;
        v_done := v_done + 1;
    end loop;
    return v_done;
end
$$;
comment on function recall.fold_lexical_terms(integer, uuid) is
    'Folds the df deltas of every tenant (or of p_tenant) with at least p_min_deltas of them into '
    'one row per lexeme and scope set; returns how many tenants. SECURITY DEFINER, for engram_worker.';
revoke all on function recall.fold_lexical_terms(integer, uuid) from public;
grant execute on function recall.fold_lexical_terms(integer, uuid) to engram_worker;
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
    perform recall.fold_lexical_terms(1, p_tenant);
    return v_rows;""")
               .replace("""    'Maintenance: folds a tenant''s statistic deltas into one row per scope set; returns the rows kept.';""",
                        """    'Maintenance: folds a tenant''s statistic deltas into one row per scope set (N and '
    'length) and per scope set and lexeme (df); returns the rows of N and length kept.';""")
               .replace("""    delete from recall.lexical_stats s where s.tenant_id = old.id;
    return null;""", """    delete from recall.lexical_stats s where s.tenant_id = old.id;
    delete from recall.lexical_term_deltas d where d.tenant_id = old.id;
    delete from recall.lexical_terms t where t.tenant_id = old.id;
    return null;"""))
assert MAINTENANCE != MAINTENANCE_0008

POLICIES = """
alter table recall.lexical_terms enable row level security;
alter table recall.lexical_terms force row level security;
alter table recall.lexical_term_deltas enable row level security;
alter table recall.lexical_term_deltas force row level security;
create policy lexical_terms__select_app on recall.lexical_terms for select to engram_app
    using (tenant_id = (select auth.tenant_id())
           and pg_catalog.arrayoverlap(scopes, (select auth.read_scopes())));
create policy lexical_terms__all_owner on recall.lexical_terms for all to engram_owner
    using (true) with check (true);
create policy lexical_term_deltas__select_app on recall.lexical_term_deltas for select to engram_app
    using (tenant_id = (select auth.tenant_id())
           and pg_catalog.arrayoverlap(scopes, (select auth.read_scopes())));
create policy lexical_term_deltas__all_owner on recall.lexical_term_deltas for all to engram_owner
    using (true) with check (true);
grant select on recall.lexical_terms, recall.lexical_term_deltas to engram_app;
-- No write grant: deltas are appended only by the chunk triggers, folded only by
-- fold_lexical_terms (both security definer).
comment on table recall.lexical_terms is
    'BM25 document frequency per scope set and lexeme (chunks holding it), as folded from '
    'lexical_term_deltas; a reader''s df is the sum of both.';
comment on column recall.lexical_terms.scopes is
    'The scope set of the counted chunks; read with the chunks'' rule, so df covers the visible corpus.';
comment on column recall.lexical_terms.chunks is 'Chunks of this scope set holding the lexeme.';
comment on table recall.lexical_term_deltas is
    'Append-only df deltas, one row per chunk-writing statement and scope set, until folded.';
comment on column recall.lexical_term_deltas.lexemes is
    'The lexemes of the chunks written or removed, each once per chunk holding it.';
comment on column recall.lexical_term_deltas.sign is '+1: chunks written; -1: chunks removed.';
"""


def upgrade() -> None:
    op.create_table(
        "lexical_terms",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("lexeme", sa.Text(), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(postgresql.UUID(as_uuid=True)), nullable=False),
        sa.Column("chunks", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "lexeme", "scopes", name="pk_lexical_terms"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_lexical_terms_scopes_nonempty"),
        schema="recall",
    )
    op.create_table(
        "lexical_term_deltas",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(postgresql.UUID(as_uuid=True)), nullable=False),
        sa.Column("sign", sa.SmallInteger(), nullable=False),
        sa.Column("lexemes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_lexical_term_deltas"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_lexical_term_deltas_scopes_nonempty"),
        sa.CheckConstraint("sign in (-1, 1)", name="ck_lexical_term_deltas_sign"),
        schema="recall",
    )
    op.execute(TRIGGER)
    op.execute(MAINTENANCE)
    # Chunks written before this revision, folded already: one row per tenant, lexeme and
    # scope set. As the migrating superuser: under the chunks' forced RLS the owner, with no
    # identity bound, sees none of them.
    op.execute("reset role")
    op.execute("insert into recall.lexical_terms (tenant_id, lexeme, scopes, chunks) "
               "select c.tenant_id, l.lexeme, c.scopes, count(*) from sources.chunks c "
               "cross join unnest(tsvector_to_array(c.lexical)) as l(lexeme) "
               "group by c.tenant_id, l.lexeme, c.scopes")
    op.execute("set role engram_owner")
    op.execute(POLICIES)


def downgrade() -> None:
    for event in ("insert", "delete", "update"):
        op.execute(f"drop trigger tg_chunks__lexical_terms_{event} on sources.chunks")
    op.execute("drop function recall.tg_chunks__lexical_terms()")
    op.execute(MAINTENANCE_0008)
    op.execute("drop function recall.fold_lexical_terms(integer, uuid)")
    op.drop_table("lexical_term_deltas", schema="recall")
    op.drop_table("lexical_terms", schema="recall")
