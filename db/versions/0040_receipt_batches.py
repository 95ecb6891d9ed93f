"""Recall receipts are sealed in the recall and chained in batches, off the recall's path.

Why: every recall appends a receipt (``provenance.receipts``), and 0006 chained it like
any memory write: the insert staged a chain event, and at COMMIT the transaction took its
tenant's chain lock (``pg_advisory_xact_lock(1701734258, hashtext(tenant))``), read the
head, hashed and appended. So every recall of a tenant queued behind every other one at
its commit, and the seal trigger hashed every served row twice (once for the versions the
insert sent, once to check them). Measured with benchmarks/recall_latency.py (3k chunks,
shared 2-core machine): side effects 19-75 ms p50 of a 170-190 ms recall; under 16
concurrent API clients of one tenant the chain lock is a queue every recall waits in.

What changes:

* **The seal stays in the recall.** ``tg_receipts__seal`` still refuses evidence that is
  not the current version of a row the asker sees, and seals the receipt with
  ``receipt_hash``. An evidence item may now leave its ``version`` out: the trigger pins
  the version as it is now (one ``provenance.row_versions`` probe per table), so a
  recall hashes each served row once instead of twice. A version that is given is checked
  exactly as before (23503 absent or invisible, 23514 another version). The trigger also
  resolves each table once and reads each table's rows with one ``row_versions`` probe
  (0006's and 0016's versions resolved the table and its key per item): 3-4 ms instead of
  8 ms for a receipt of 18 rows from two tables, measured on the shared machine.
* **The chain event waits in a queue.** The receipts' INSERT chain trigger is replaced by
  ``tg_receipts__queue_chain``: in the recall's own transaction it writes one row per
  receipt to ``provenance.receipt_queue`` with everything the chain event will carry
  (time of the write, actor, activity, the row's version). The queue is an ordinary logged
  table written in the same transaction as the receipt: both commit or neither does, so
  a crash at any moment (after the seal, before the chaining, during it) loses nothing.
* **Chaining in batches.** ``provenance.chain_receipts(p_limit)`` (SECURITY DEFINER,
  executable by ``engram_app`` and ``engram_worker``) appends the queued receipts of each
  tenant to its chain under the same tenant lock as every other chain write, numbered in
  queue order, and deletes what it chained, in one transaction. Recall runs it in a
  background thread of the process that recalled (a moment after a receipt, and on
  exit); ``engram worker run`` runs it too, so receipts left by a process that was killed
  are chained by whichever process runs next.
* **Verification knows the queue.** ``verify_rows`` does not report a queued receipt as a
  row without a chain event (it is one that will get it); ``verify_receipt`` reports it as
  sealed and waiting to be chained (not yet proven). Auditors and the verifier may read
  the queue.

The receipts' UPDATE and DELETE chain triggers stay (both are refused anyway); the
catalog guard (sql_checks/22) accepts the queue trigger as the receipts' INSERT chain.

Revision ID: 0040_receipt_batches
Revises: 0031_drop_dead_policy
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0040_receipt_batches"
down_revision = "0031_drop_dead_policy"
branch_labels = None
depends_on = None

# The settings that make to_jsonb(row) deterministic (as in 0006; frozen here).
CANONICAL_SETTINGS = (
    "set timezone = 'UTC' set datestyle = 'ISO, YMD' set intervalstyle = 'iso_8601' "
    "set extra_float_digits = 1 set bytea_output = 'hex'"
)

SEAL = r"""
create or replace function provenance.tg_receipts__seal() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_item jsonb;
    v_name text;
    v_table regclass;
    v_canonical jsonb := '{}';  -- {"<table as written>": "<schema.table>"}
    v_current jsonb := '{}';    -- {"<table as written> <id>": "<version hex>"}
    v_hex text;
    v_key text;
    v_clean jsonb := '[]';
begin
    if jsonb_typeof(new.evidence) is distinct from 'array' then
        raise exception 'receipt evidence must be a JSON array' using errcode = '22023';
    end if;
    for v_item in select x from jsonb_array_elements(new.evidence) as x loop
        if jsonb_typeof(v_item) <> 'object' or jsonb_typeof(v_item -> 'table') <> 'string'
           or jsonb_typeof(v_item -> 'row_id') <> 'object'
           or coalesce(v_item ->> 'version', '0000000000000000000000000000000000000000000000000000000000000000')
              !~ '^[0-9a-f]{64}$' then
            raise exception 'each evidence item needs table (text), row_id (object) and version '
                            '(64 hex digits, or left out for the version as it is now); got %', v_item
                using errcode = '22023';
        end if;
    end loop;
    -- Each table named once: resolved, and its id-keyed rows' versions in one probe.
    for v_name in select distinct x ->> 'table' from jsonb_array_elements(new.evidence) as x loop
        v_table := to_regclass(v_name);
        if v_table is null then
            raise exception 'evidence names an unknown table %', v_name using errcode = '22023';
        end if;
        v_canonical := v_canonical || jsonb_build_object(v_name, provenance.table_name(v_table));
        if v_table in (select provenance.chained_tables())
           and provenance.key_columns(v_table) = array['id'] then
            v_current := v_current || coalesce((
                select jsonb_object_agg(v_name || ' ' || v.id::text, encode(v.version, 'hex'))
                  from provenance.row_versions(v_table, array(
                           select (x -> 'row_id' ->> 'id')::uuid from jsonb_array_elements(new.evidence) as x
                            where x ->> 'table' = v_name and (x -> 'row_id') - 'id'::text = '{}'::jsonb
                              and x -> 'row_id' ->> 'id' ~ '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$'),
                       new.tenant_id) as v), '{}');
        end if;
    end loop;
    for v_item in select x from jsonb_array_elements(new.evidence) as x loop
        v_key := v_item -> 'row_id' ->> 'id';
        if (v_item -> 'row_id') - 'id'::text = '{}'::jsonb and v_key ~ '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$' then
            v_hex := v_current ->> (v_item ->> 'table' || ' ' || v_key);
        else
            v_hex := null;
        end if;
        if v_hex is null then
            v_hex := encode(provenance.row_version(to_regclass(v_item ->> 'table'), v_item -> 'row_id', new.tenant_id), 'hex');
        end if;
        if v_hex is null then
            raise exception 'evidence %.% does not exist or is not visible', v_item ->> 'table',
                v_item -> 'row_id' using errcode = '23503';
        end if;
        if v_item ->> 'version' is not null and v_hex <> v_item ->> 'version' then
            raise exception 'evidence % % was served at version % but is now at version %',
                v_item ->> 'table', v_item -> 'row_id', v_item ->> 'version', v_hex
                using errcode = '23514';
        end if;
        v_clean := v_clean || jsonb_build_array(jsonb_build_object(
            'table', v_canonical ->> (v_item ->> 'table'), 'row_id', v_item -> 'row_id', 'version', v_hex));
    end loop;
    new.evidence := v_clean;
    new.asked_by := coalesce(auth.user_id(), new.asked_by);
    new.asked_at := clock_timestamp();
    new.activity_id := coalesce(new.activity_id,
                                nullif(current_setting('engram.activity_id', true), '')::uuid);
    new.receipt_hash := provenance.receipt_hash(new.tenant_id, new.id, new.asked_by, new.asked_at,
                                                new.question_hash, new.evidence, new.rendered_hash);
    return new;
end
$$;
"""

QUEUE = r"""
-- SECURITY DEFINER for the reason tg_chain__append is: the writers hold no grant on the
-- queue. The queued row is what tg_chain__append would have staged for this insert.
create function provenance.tg_receipts__queue_chain() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
    """ + CANONICAL_SETTINGS + r"""
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_user text := auth.user_id();
    v_role text := coalesce(nullif(current_setting('role', true), 'none'), session_user);
    v_activity uuid := nullif(current_setting('engram.activity_id', true), '')::uuid;
begin
    -- Checked now, not when the batch is chained: a queued row must never be one the
    -- chainer has to refuse (it would hold up every receipt queued after it).
    if v_activity is not null and exists (
            select 1 from new_rows n where not exists (
                select 1 from provenance.activities a where a.tenant_id = n.tenant_id and a.id = v_activity)) then
        raise exception 'engram.activity_id % names no activity of this tenant; start one with '
                        'provenance.begin_activity', v_activity using errcode = '22023';
    end if;
    insert into provenance.receipt_queue (tenant_id, id, recorded_at, actor_user, actor_role,
                                          activity_id, row_hash)
    select n.tenant_id, n.id, v_now, v_user, v_role, v_activity,
           sha256(convert_to(to_jsonb(n)::text, 'UTF8'))
      from new_rows n;
    return null;
end
$$;
comment on function provenance.tg_receipts__queue_chain() is
    'Receipts'' INSERT chain trigger: queues each new receipt''s chain event (time, actor, '
    'activity, version) in its transaction; provenance.chain_receipts appends it later.';
revoke all on function provenance.tg_receipts__queue_chain() from public;

-- SECURITY DEFINER: only the owner may append to the chain. Any role that recalls or runs
-- the worker may ask for the queue to be chained; it appends nothing but queued rows.
create function provenance.chain_receipts(p_limit integer default 1000) returns integer
    language plpgsql volatile security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid;
    v_seq bigint;
    v_prev bytea;
    v_hash bytea;
    v_done integer := 0;
    r record;
    a_seq bigint[];
    a_at timestamptz[];
    a_row jsonb[];
    a_user text[];
    a_role text[];
    a_activity uuid[];
    a_row_hash bytea[];
    a_prev bytea[];
    a_hash bytea[];
    a_id uuid[];
begin
    if p_limit is null or p_limit < 1 then
        raise exception 'chain_receipts needs a positive limit, not %', p_limit using errcode = '22023';
    end if;
    -- Tenants in a fixed order, one chain lock each, as every other chain write takes it.
    for v_tenant in select distinct q.tenant_id from provenance.receipt_queue q order by 1 loop
        exit when v_done >= p_limit;
        perform pg_advisory_xact_lock(1701734258, hashtext(v_tenant::text));
        select e.seq, e.hash into v_seq, v_prev
          from provenance.events e where e.tenant_id = v_tenant order by e.seq desc limit 1;
        v_seq := coalesce(v_seq, 0);
        v_prev := coalesce(v_prev, provenance.genesis_hash());
        a_seq := '{}'; a_at := '{}'; a_row := '{}'; a_user := '{}'; a_role := '{}';
        a_activity := '{}'; a_row_hash := '{}'; a_prev := '{}'; a_hash := '{}'; a_id := '{}';
        -- Read after the lock: a chainer that held it before us has deleted what it chained.
        for r in
            select q.* from provenance.receipt_queue q where q.tenant_id = v_tenant
             order by q.recorded_at, q.id limit p_limit - v_done
        loop
            v_seq := v_seq + 1;
            v_hash := sha256(v_prev || provenance.event_body(
                v_tenant, v_seq, r.recorded_at, 'provenance.receipts', jsonb_build_object('id', r.id),
                'INSERT', r.actor_user, r.actor_role, r.activity_id, r.row_hash));
            a_seq := array_append(a_seq, v_seq);
            a_at := array_append(a_at, r.recorded_at);
            a_row := array_append(a_row, jsonb_build_object('id', r.id));
            a_user := array_append(a_user, r.actor_user);
            a_role := array_append(a_role, r.actor_role);
            a_activity := array_append(a_activity, r.activity_id);
            a_row_hash := array_append(a_row_hash, r.row_hash);
            a_prev := array_append(a_prev, v_prev);
            a_hash := array_append(a_hash, v_hash);
            a_id := array_append(a_id, r.id);
            v_prev := v_hash;
        end loop;
        insert into provenance.events (tenant_id, seq, recorded_at, table_name, row_id, operation,
                                       actor_user, actor_role, activity_id, row_hash, prev_hash, hash)
        select v_tenant, u.seq, u.at, 'provenance.receipts', u.row_id, 'INSERT', u.actor_user,
               u.actor_role, u.activity, u.row_hash, u.prev, u.hash
          from unnest(a_seq, a_at, a_row, a_user, a_role, a_activity, a_row_hash, a_prev, a_hash)
               as u(seq, at, row_id, actor_user, actor_role, activity, row_hash, prev, hash);
        delete from provenance.receipt_queue q where q.tenant_id = v_tenant and q.id = any(a_id);
        v_done := v_done + cardinality(a_id);
    end loop;
    return v_done;
end
$$;
comment on function provenance.chain_receipts(integer) is
    'Appends up to p_limit queued receipts to their tenants'' chains (queue order, under each '
    'tenant''s chain lock) and removes them from the queue; returns how many.';
revoke all on function provenance.chain_receipts(integer) from public;
grant usage on schema provenance to engram_worker;
grant execute on function provenance.chain_receipts(integer) to engram_app, engram_worker;
"""

POLICIES = """
alter table provenance.receipt_queue enable row level security;
alter table provenance.receipt_queue force row level security;
create policy receipt_queue__all_owner on provenance.receipt_queue for all to engram_owner
    using (true) with check (true);
create policy receipt_queue__select_auditor on provenance.receipt_queue for select to engram_auditor
    using (true);
create policy receipt_queue__select_verifier on provenance.receipt_queue for select to engram_verifier
    using (true);
grant select on provenance.receipt_queue to engram_auditor, engram_verifier;
comment on table provenance.receipt_queue is
    'Receipts sealed but not yet on their tenant''s chain: the chain event each will get '
    '(provenance.chain_receipts appends and removes them).';
comment on column provenance.receipt_queue.recorded_at is 'Time of the receipt''s insert: the event''s recorded_at.';
comment on column provenance.receipt_queue.row_hash is 'The receipt row''s version: the event''s row_hash.';

drop trigger tg_receipts__chain_insert on provenance.receipts;
create trigger tg_receipts__queue_chain after insert on provenance.receipts
    referencing new table as new_rows
    for each statement execute function provenance.tg_receipts__queue_chain();
"""

# 0006's verify_rows; {queued} makes a queued receipt not a row without a chain event.
VERIFY_ROWS = r"""
create or replace function provenance.verify_rows(p_tenant uuid default null)
    returns table (tenant_id uuid, table_name text, row_id jsonb, problem text, event_seq bigint,
                   expected_hash bytea, found_hash bytea)
    language plpgsql stable security definer
    set search_path = pg_catalog, pg_temp
    """ + CANONICAL_SETTINGS + r"""
as $$
declare
    v_table regclass;
    v_row_id text;
begin
    for v_table in select provenance.chained_tables() loop
        v_row_id := (select 'jsonb_build_object(' || string_agg(format('%L, t.%I', k, k), ', ') || ')'
                       from unnest(provenance.key_columns(v_table)) as k);
        return query execute format($q$
            with cur as (
                select t.tenant_id, %1$s as row_id, sha256(convert_to(to_jsonb(t)::text, 'UTF8')) as h
                  from %2$s t where $1 is null or t.tenant_id = $1
            ), lat as (
                select distinct on (e.tenant_id, e.row_id) e.tenant_id, e.row_id, e.seq, e.operation,
                       e.row_hash
                  from provenance.events e
                 where e.table_name = $2 and ($1 is null or e.tenant_id = $1)
                 order by e.tenant_id, e.row_id, e.seq desc
            )
            select coalesce(c.tenant_id, l.tenant_id), $2, coalesce(c.row_id, l.row_id), p.problem,
                   l.seq, l.row_hash, c.h
              from cur c full join lat l on l.tenant_id = c.tenant_id and l.row_id = c.row_id
             cross join lateral (select case{queued}
                 when l.seq is null then 'row has no chain event'
                 when c.row_id is null and l.operation <> 'DELETE' then 'row was deleted without a chain event'
                 when c.row_id is not null and l.operation = 'DELETE' then 'row exists but its latest chain event deleted it'
                 when c.row_id is not null and c.h <> l.row_hash then 'row differs from its latest chain event'
                 end as problem) p
             where p.problem is not null
             order by 1, l.seq nulls first$q$, v_row_id, v_table)
        using p_tenant, provenance.table_name(v_table);
    end loop;
end
$$;
"""

QUEUED = """
                 when l.seq is null and $2 = 'provenance.receipts' and exists (
                     select 1 from provenance.receipt_queue q
                      where q.tenant_id = c.tenant_id and q.id = (c.row_id ->> 'id')::uuid
                        and q.row_hash = c.h) then null"""


def _load(module: str) -> Any:
    """A released revision's module (pinned by db/released.sha256: it cannot change under us)."""
    path = Path(__file__).with_name(f"{module}.py")
    spec = importlib.util.spec_from_file_location(f"engram_released_{module}", path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def upgrade() -> None:
    op.create_table(
        "receipt_queue",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor_user", sa.Text(), nullable=True),
        sa.Column("actor_role", sa.Text(), nullable=False),
        sa.Column("activity_id", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("row_hash", postgresql.BYTEA(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_receipt_queue"),
        sa.CheckConstraint("length(row_hash) = 32", name="ck_receipt_queue_row_hash_length"),
        schema="provenance",
    )
    op.execute(SEAL)
    op.execute(QUEUE)
    op.execute(POLICIES)
    op.execute("reset role")
    op.execute(VERIFY_ROWS.replace("{queued}", QUEUED))
    op.execute("set role engram_owner")


def downgrade() -> None:
    # Nothing queued may be lost: chain it first, then chain receipts at commit again.
    op.execute("select provenance.chain_receipts(2147483647)")
    op.execute("drop trigger tg_receipts__queue_chain on provenance.receipts")
    op.execute("create trigger tg_receipts__chain_insert after insert on provenance.receipts "
               "referencing new table as new_rows for each statement "
               "execute function provenance.tg_chain__append('id')")
    op.execute("drop function provenance.chain_receipts(integer)")
    op.execute("revoke usage on schema provenance from engram_worker")
    op.execute("drop function provenance.tg_receipts__queue_chain()")
    op.execute("reset role")
    op.execute(VERIFY_ROWS.replace("{queued}", ""))
    op.execute("set role engram_owner")
    op.execute(_load("0016_row_versions").SEAL)
    op.drop_table("receipt_queue", schema="provenance")
