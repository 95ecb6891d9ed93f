"""Provenance: the per-tenant hash chain, PROV-O lineage and recall receipts.

Why: auditors must be able to prove, without trusting the application, that the
memory was not altered and where any recalled evidence came from. So every
INSERT, UPDATE and DELETE on a memory table appends an event to its tenant's
hash chain, by trigger, never by application code:

* ``provenance.events``: ``(tenant_id, seq)`` gap-free per tenant; the event
  carries the table, the row's primary key (jsonb, without ``tenant_id``), the
  operation, the acting user (``auth.user_id()``) and role (the session's
  ``SET ROLE``, else the login role), the activity that caused it
  (``engram.activity_id``, set by ``provenance.begin_activity``), the SHA-256 of
  the canonical row image, the previous event's hash and its own hash
  ``sha256(prev_hash || event_body)``. ``docs/provenance.md`` defines both
  canonical forms.
* Chain triggers are statement-level with transition tables (one call per
  statement, however many rows). They only stage events (``provenance.pending``,
  unlogged); a deferred constraint trigger numbers and hashes them at COMMIT,
  once per tenant and transaction, under a transaction-scoped advisory lock
  keyed by the tenant, reading the tenant's last event through the primary key.
  So events are numbered in commit order, writers of one tenant queue only for
  their commit (an open writer blocks nobody, and the chain adds no deadlock),
  writers of different tenants never wait on each other, and no hot "head" row
  collects a new version per write.
* The trigger function is SECURITY DEFINER (owner ``engram_owner``) because the
  writing roles (``engram_app``, ``engram_worker``) have no grant on the chain;
  FORCE RLS holds for the owner too, so explicit owner policies allow exactly
  SELECT and INSERT. UPDATE, DELETE and TRUNCATE are refused for every role by
  missing policies, revoked grants (the owner's own included) and triggers
  that raise (which stop even a superuser until they are disabled).
* ``engram_verifier`` (NOLOGIN) owns the few functions that read memory rows
  for auditors (``verify_rows``, ``audit_row_version``): they return keys and
  hashes, never content. ``engram_auditor`` reads the provenance tables of
  every tenant and calls those functions; it reads no memory table and writes
  nothing.
* ``provenance.attach_chain(regclass)`` chains a table; this revision applies
  it to every tenant table that exists now in ``sources``, ``knowledge`` and
  ``memory`` (and to its own tables); later revisions call it for new tables.
  Rows that exist before a table is chained get a ``BASELINE`` event.
* PROV-O: agents (persons, software, models with version), activities (kind,
  start/end, who), derivation edges between row versions (or from an agent,
  e.g. an embedding from its model), and recall receipts. Derivations and
  receipts are append-only, and chained themselves.

The provenance tables have no foreign key to ``auth.tenants``: the record of
what happened outlives the tenant it happened to.

Revision ID: 0006_provenance
Revises: 0005_derived_memory
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006_provenance"
down_revision = "0005_derived_memory"
branch_labels = None
depends_on = None

MEMORY_SCHEMAS = ("sources", "knowledge", "memory")
CHAINED_OWN_TABLES = ("agents", "activities", "derivations", "receipts")

# The settings that make to_jsonb(row) deterministic: timestamps in UTC, floats
# shortest-exact, bytea in hex, intervals in ISO 8601.
CANONICAL_SETTINGS = (
    "set timezone = 'UTC' set datestyle = 'ISO, YMD' set intervalstyle = 'iso_8601' "
    "set extra_float_digits = 1 set bytea_output = 'hex'"
)

ROLE_SQL = """
do $roles$
begin
    if not exists (select 1 from pg_roles where rolname = 'engram_verifier') then
        create role engram_verifier nologin nobypassrls nocreatedb nocreaterole noinherit;
    end if;
end
$roles$;
comment on role engram_verifier is
    'Owns the provenance functions that hash memory rows for auditors; NOLOGIN.';
grant engram_verifier to engram_owner;
"""

FUNCTIONS_SQL = r"""
create function provenance.genesis_hash() returns bytea
    language sql immutable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$ select '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea $$;
comment on function provenance.genesis_hash() is 'The prev_hash of every tenant''s first event: 32 zero bytes.';

create function provenance.table_name(p_table regclass) returns text
    language sql stable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select n.nspname || '.' || c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
     where c.oid = p_table
$$;
comment on function provenance.table_name(regclass) is
    'schema.table, unquoted: the form events.table_name stores.';

-- No SET clause: the function is inlined into the chain trigger's and the
-- verifier's per-event expressions; every name in it is schema-qualified.
create function provenance.event_body(
    p_tenant uuid, p_seq bigint, p_recorded_at timestamptz, p_table text, p_row_id jsonb,
    p_operation text, p_actor_user text, p_actor_role text, p_activity uuid, p_row_hash bytea
) returns bytea
    language sql stable parallel safe security invoker
as $$
    select pg_catalog.convert_to(pg_catalog.jsonb_build_array(
        p_tenant::text, p_seq,
        pg_catalog.to_char(pg_catalog.timezone('UTC', p_recorded_at), 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        p_table, p_row_id, p_operation, p_actor_user, p_actor_role, p_activity::text,
        pg_catalog.encode(p_row_hash, 'hex'))::text, 'UTF8')
$$;
comment on function provenance.event_body(uuid, bigint, timestamptz, text, jsonb, text, text, text, uuid, bytea) is
    'The canonical bytes of an event (a JSON array, see docs/provenance.md); '
    'hash = sha256(prev_hash || event_body).';

create function provenance.key_columns(p_table regclass) returns text[]
    language sql stable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select array_agg(a.attname::text order by k.ord)
      from pg_index i
     cross join lateral unnest(i.indkey::int2[]) with ordinality as k(attnum, ord)
      join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
     where i.indrelid = p_table and i.indisprimary and a.attname <> 'tenant_id'
$$;
comment on function provenance.key_columns(regclass) is
    'Primary-key columns of a table other than tenant_id, in key order: the row id of its events.';

create function provenance.append_events(p_table text, p_operation text, p_key text[], p_images jsonb[])
    returns void
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid;
    v_seq bigint;
    v_prev bytea;
    v_hash bytea;
    v_now timestamptz := clock_timestamp();
    v_user text := auth.user_id();
    v_role text := coalesce(nullif(current_setting('role', true), 'none'), session_user);
    v_activity uuid := nullif(current_setting('engram.activity_id', true), '')::uuid;
    r record;
    a_seq bigint[];
    a_row jsonb[];
    a_row_hash bytea[];
    a_prev bytea[];
    a_hash bytea[];
begin
    -- Tenants in a fixed order, so that two multi-tenant statements cannot deadlock.
    for v_tenant in
        select distinct (i ->> 'tenant_id')::uuid from unnest(p_images) as i order by 1
    loop
        -- 1701734258 is the lock class of the chain ('engr'); the second key is the tenant.
        perform pg_advisory_xact_lock(1701734258, hashtext(v_tenant::text));
        select e.seq, e.hash into v_seq, v_prev
          from provenance.events e where e.tenant_id = v_tenant order by e.seq desc limit 1;
        v_seq := coalesce(v_seq, 0);
        v_prev := coalesce(v_prev, provenance.genesis_hash());
        -- engram.activity_id is a plain setting any session can write: an event may
        -- only name an activity that exists in its tenant.
        if v_activity is not null and not exists (
                select 1 from provenance.activities a where a.tenant_id = v_tenant and a.id = v_activity) then
            raise exception 'engram.activity_id % names no activity of this tenant; start one with '
                            'provenance.begin_activity', v_activity using errcode = '22023';
        end if;
        a_seq := '{}'; a_row := '{}'; a_row_hash := '{}'; a_prev := '{}'; a_hash := '{}';
        for r in
            select (select jsonb_object_agg(k, u.i -> k) from unnest(p_key) as k) as row_id,
                   sha256(convert_to(u.i::text, 'UTF8')) as row_hash
              from unnest(p_images) with ordinality as u(i, ord)
             where (u.i ->> 'tenant_id')::uuid = v_tenant
             order by u.ord
        loop
            v_seq := v_seq + 1;
            v_hash := sha256(v_prev || provenance.event_body(v_tenant, v_seq, v_now, p_table, r.row_id,
                                                             p_operation, v_user, v_role, v_activity,
                                                             r.row_hash));
            a_seq := array_append(a_seq, v_seq);
            a_row := array_append(a_row, r.row_id);
            a_row_hash := array_append(a_row_hash, r.row_hash);
            a_prev := array_append(a_prev, v_prev);
            a_hash := array_append(a_hash, v_hash);
            v_prev := v_hash;
        end loop;
        insert into provenance.events (tenant_id, seq, recorded_at, table_name, row_id, operation,
                                       actor_user, actor_role, activity_id, row_hash, prev_hash, hash)
        select v_tenant, u.seq, v_now, p_table, u.row_id, p_operation, v_user, v_role, v_activity,
               u.row_hash, u.prev_hash, u.hash
          from unnest(a_seq, a_row, a_row_hash, a_prev, a_hash) as u(seq, row_id, row_hash, prev_hash, hash);
    end loop;
end
$$;
comment on function provenance.append_events(text, text, text[], jsonb[]) is
    'Internal: appends one event per row image to each tenant''s chain (called by the chain trigger).';
revoke all on function provenance.append_events(text, text, text[], jsonb[]) from public;

-- SECURITY DEFINER: the writing roles have no grant on the chain or its staging
-- table, and must not have one; the function is owned by engram_owner, whose
-- policies allow exactly what it does. EXECUTE is revoked from PUBLIC, so no role
-- can attach it to a table of its own and forge events.
create function provenance.tg_chain__append() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
    """ + CANONICAL_SETTINGS + r"""
as $$
declare
    v_txid bigint := pg_current_xact_id()::text::bigint;
    v_now timestamptz := clock_timestamp();
    v_table text := tg_table_schema || '.' || tg_table_name;
    v_user text := auth.user_id();
    v_role text := coalesce(nullif(current_setting('role', true), 'none'), session_user);
    v_activity uuid := nullif(current_setting('engram.activity_id', true), '')::uuid;
begin
    -- Staged here, numbered and hashed at commit (tg_pending_commits__chain), so that a
    -- tenant's writers queue for the chain only while they commit.
    if tg_op = 'DELETE' then
        insert into provenance.pending (tenant_id, txid, ord, recorded_at, table_name, row_id, operation,
                                        actor_user, actor_role, activity_id, row_hash)
        select (x.i ->> 'tenant_id')::uuid, v_txid, nextval('provenance.pending_ord'), v_now, v_table,
               (select jsonb_object_agg(k, x.i -> k) from unnest(tg_argv) as k), tg_op, v_user, v_role,
               v_activity, sha256(convert_to(x.i::text, 'UTF8'))
          from (select to_jsonb(o) as i from old_rows o) x;
        insert into provenance.pending_commits (tenant_id, txid)
        select distinct o.tenant_id, v_txid from old_rows o on conflict do nothing;
    else
        insert into provenance.pending (tenant_id, txid, ord, recorded_at, table_name, row_id, operation,
                                        actor_user, actor_role, activity_id, row_hash)
        select (x.i ->> 'tenant_id')::uuid, v_txid, nextval('provenance.pending_ord'), v_now, v_table,
               (select jsonb_object_agg(k, x.i -> k) from unnest(tg_argv) as k), tg_op, v_user, v_role,
               v_activity, sha256(convert_to(x.i::text, 'UTF8'))
          from (select to_jsonb(n) as i from new_rows n) x;
        insert into provenance.pending_commits (tenant_id, txid)
        select distinct n.tenant_id, v_txid from new_rows n on conflict do nothing;
    end if;
    return null;
end
$$;
comment on function provenance.tg_chain__append() is
    'Chain trigger (statement level, transition tables): stages one event per written row for the '
    'commit-time chaining. Arguments: the primary-key columns other than tenant_id.';
revoke all on function provenance.tg_chain__append() from public;

create function provenance.chained_tables() returns setof regclass
    language sql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select distinct t.tgrelid::regclass from pg_trigger t
     where t.tgfoid = 'provenance.tg_chain__append()'::regprocedure
     order by 1
$$;
comment on function provenance.chained_tables() is 'Every table whose writes append to the chain.';


-- SECURITY DEFINER for the same reason as tg_chain__append; it runs at commit
-- (a deferred constraint trigger), once per tenant and transaction.
create function provenance.tg_pending_commits__chain() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_seq bigint;
    v_prev bytea;
    v_hash bytea;
    v_checked uuid;
    r record;
    a_seq bigint[] := '{}';
    a_at timestamptz[] := '{}';
    a_table text[] := '{}';
    a_row jsonb[] := '{}';
    a_op text[] := '{}';
    a_user text[] := '{}';
    a_role text[] := '{}';
    a_activity uuid[] := '{}';
    a_row_hash bytea[] := '{}';
    a_prev bytea[] := '{}';
    a_hash bytea[] := '{}';
begin
    -- 1701734258 is the lock class of the chain ('engr'); the second key is the tenant.
    perform pg_advisory_xact_lock(1701734258, hashtext(new.tenant_id::text));
    select e.seq, e.hash into v_seq, v_prev
      from provenance.events e where e.tenant_id = new.tenant_id order by e.seq desc limit 1;
    v_seq := coalesce(v_seq, 0);
    v_prev := coalesce(v_prev, provenance.genesis_hash());
    for r in
        select * from provenance.pending p where p.tenant_id = new.tenant_id and p.txid = new.txid
         order by p.ord
    loop
        -- engram.activity_id is a plain setting any session can write: an event may
        -- only name an activity that exists in its tenant.
        if r.activity_id is not null and r.activity_id is distinct from v_checked then
            if not exists (select 1 from provenance.activities a
                            where a.tenant_id = new.tenant_id and a.id = r.activity_id) then
                raise exception 'engram.activity_id % names no activity of this tenant; start one with '
                                'provenance.begin_activity', r.activity_id using errcode = '22023';
            end if;
            v_checked := r.activity_id;
        end if;
        v_seq := v_seq + 1;
        v_hash := sha256(v_prev || provenance.event_body(new.tenant_id, v_seq, r.recorded_at, r.table_name,
                                                         r.row_id, r.operation, r.actor_user, r.actor_role,
                                                         r.activity_id, r.row_hash));
        a_seq := array_append(a_seq, v_seq);
        a_at := array_append(a_at, r.recorded_at);
        a_table := array_append(a_table, r.table_name);
        a_row := array_append(a_row, r.row_id);
        a_op := array_append(a_op, r.operation);
        a_user := array_append(a_user, r.actor_user);
        a_role := array_append(a_role, r.actor_role);
        a_activity := array_append(a_activity, r.activity_id);
        a_row_hash := array_append(a_row_hash, r.row_hash);
        a_prev := array_append(a_prev, v_prev);
        a_hash := array_append(a_hash, v_hash);
        v_prev := v_hash;
    end loop;
    insert into provenance.events (tenant_id, seq, recorded_at, table_name, row_id, operation,
                                   actor_user, actor_role, activity_id, row_hash, prev_hash, hash)
    select new.tenant_id, u.* from unnest(a_seq, a_at, a_table, a_row, a_op, a_user, a_role, a_activity,
                                          a_row_hash, a_prev, a_hash) as u;
    delete from provenance.pending p where p.tenant_id = new.tenant_id and p.txid = new.txid;
    delete from provenance.pending_commits c where c.tenant_id = new.tenant_id and c.txid = new.txid;
    return null;
end
$$;
comment on function provenance.tg_pending_commits__chain() is
    'At commit: numbers and hashes the transaction''s staged events of one tenant onto its chain.';
revoke all on function provenance.tg_pending_commits__chain() from public;

create function provenance.baseline(p_table regclass) returns bigint
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
    """ + CANONICAL_SETTINGS + r"""
as $$
declare
    v_images jsonb[];
begin
    execute format('select array_agg(to_jsonb(t)) from %s t', p_table) into v_images;
    if v_images is null then
        return 0;
    end if;
    perform provenance.append_events(provenance.table_name(p_table), 'BASELINE',
                                     provenance.key_columns(p_table), v_images);
    return cardinality(v_images);
end
$$;
comment on function provenance.baseline(regclass) is
    'Appends a BASELINE event for every existing row of a table (run when a table with rows '
    'is first chained; needs a role that sees every row, i.e. the migrating superuser).';
revoke all on function provenance.baseline(regclass) from public;

create function provenance.attach_chain(p_table regclass) returns void
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_schema text;
    v_name text;
    v_key text[] := provenance.key_columns(p_table);
    v_args text;
begin
    select n.nspname, c.relname into v_schema, v_name
      from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.oid = p_table;
    if not exists (select 1 from pg_attribute a where a.attrelid = p_table
                      and a.attname = 'tenant_id' and not a.attisdropped) then
        raise exception 'table % has no tenant_id column; the chain is per tenant', p_table
            using errcode = '42P16';
    end if;
    if v_key is null then
        raise exception 'table % needs a primary key (tenant_id, ...) to be chained', p_table
            using errcode = '42P16';
    end if;
    if p_table = 'provenance.events'::regclass then
        raise exception 'the chain cannot chain itself' using errcode = '42P16';
    end if;
    v_args := (select string_agg(quote_literal(k), ', ') from unnest(v_key) as k);
    execute format('create trigger %I after insert on %s referencing new table as new_rows '
                   'for each statement execute function provenance.tg_chain__append(%s)',
                   'tg_' || v_name || '__chain_insert', p_table, v_args);
    execute format('create trigger %I after update on %s referencing old table as old_rows '
                   'new table as new_rows for each statement '
                   'execute function provenance.tg_chain__append(%s)',
                   'tg_' || v_name || '__chain_update', p_table, v_args);
    execute format('create trigger %I after delete on %s referencing old table as old_rows '
                   'for each statement execute function provenance.tg_chain__append(%s)',
                   'tg_' || v_name || '__chain_delete', p_table, v_args);
    -- The verifier hashes current rows for auditors (keys and hashes only).
    execute format('grant usage on schema %I to engram_verifier', v_schema);
    execute format('grant select on %s to engram_verifier', p_table);
    execute format('create policy %I on %s for select to engram_verifier using (true)',
                   v_name || '__select_verifier', p_table);
end
$$;
comment on function provenance.attach_chain(regclass) is
    'Migration helper: every INSERT/UPDATE/DELETE on the table appends to its tenant''s chain; '
    'the verifier may hash its rows. Call once for each new memory table.';
revoke all on function provenance.attach_chain(regclass) from public;

create function provenance.tg_append_only__refuse() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    raise exception '%.% is append-only: % is refused', tg_table_schema, tg_table_name, tg_op
        using errcode = '42501';
end
$$;
comment on function provenance.tg_append_only__refuse() is
    'Refuses UPDATE, DELETE and TRUNCATE on append-only provenance tables, for every role.';

create function provenance.verify_chain(p_tenant uuid default null, p_from bigint default 1)
    returns table (tenant_id uuid, ok boolean, checked bigint, head_seq bigint, head_hash bytea,
                   broken_seq bigint, problem text, expected_hash bytea, found_hash bytea)
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid;
    v_prev bytea;
    v_next bigint;
    v_calc bytea;
    e record;
begin
    if p_from is null or p_from < 1 then
        raise exception 'the first sequence number to verify must be 1 or more, not %', p_from
            using errcode = '22023';
    end if;
    for v_tenant in
        select distinct ev.tenant_id from provenance.events ev
         where p_tenant is null or ev.tenant_id = p_tenant order by 1
    loop
        tenant_id := v_tenant; ok := true; checked := 0; broken_seq := null; problem := null;
        expected_hash := null; found_hash := null;
        select ev.seq, ev.hash into head_seq, head_hash from provenance.events ev
         where ev.tenant_id = v_tenant order by ev.seq desc limit 1;
        if p_from = 1 then
            v_prev := provenance.genesis_hash();
        else
            select ev.hash into v_prev from provenance.events ev
             where ev.tenant_id = v_tenant and ev.seq = p_from - 1;
            if v_prev is null then
                ok := false; broken_seq := p_from - 1;
                problem := format('event %s, the link before the first one checked, is missing', p_from - 1);
                return next;
                continue;
            end if;
        end if;
        v_next := p_from;
        for e in
            select * from provenance.events ev where ev.tenant_id = v_tenant and ev.seq >= p_from
             order by ev.seq
        loop
            if e.seq <> v_next then
                ok := false; broken_seq := v_next;
                problem := format('event %s is missing (the next event is %s)', v_next, e.seq);
                exit;
            end if;
            if e.prev_hash is distinct from v_prev then
                ok := false; broken_seq := e.seq; expected_hash := v_prev; found_hash := e.prev_hash;
                problem := format('event %s does not link to event %s (prev_hash differs)', e.seq, e.seq - 1);
                exit;
            end if;
            v_calc := sha256(e.prev_hash || provenance.event_body(
                e.tenant_id, e.seq, e.recorded_at, e.table_name, e.row_id, e.operation,
                e.actor_user, e.actor_role, e.activity_id, e.row_hash));
            if v_calc is distinct from e.hash then
                ok := false; broken_seq := e.seq; expected_hash := v_calc; found_hash := e.hash;
                problem := format('event %s was altered (its content does not match its hash)', e.seq);
                exit;
            end if;
            v_prev := e.hash;
            v_next := v_next + 1;
            checked := checked + 1;
        end loop;
        return next;
    end loop;
end
$$;
comment on function provenance.verify_chain(uuid, bigint) is
    'Recomputes each tenant''s chain from p_from: ok with the count and head, or the first broken '
    'link (missing event, prev_hash that does not link, altered content) with expected/found hash.';

create function provenance.row_version(p_table regclass, p_row_id jsonb,
                                       p_tenant uuid default auth.tenant_id())
    returns bytea
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
    """ + CANONICAL_SETTINGS + r"""
as $$
declare
    v_key text[] := provenance.key_columns(p_table);
    v_cond text;
    v_hash bytea;
begin
    if p_table not in (select provenance.chained_tables()) then
        raise exception 'table % is not a chained memory table', p_table using errcode = '22023';
    end if;
    if p_row_id is null or jsonb_typeof(p_row_id) <> 'object'
       or (select array_agg(k order by k) from jsonb_object_keys(p_row_id) as k)
          is distinct from (select array_agg(k order by k) from unnest(v_key) as k) then
        raise exception 'a row id of % is an object with exactly the keys %', p_table,
            array_to_string(v_key, ', ') using errcode = '22023';
    end if;
    v_cond := (select string_agg(format('t.%1$I = k.%1$I', c), ' and ') from unnest(v_key) as c);
    execute format('select sha256(convert_to(to_jsonb(t)::text, ''UTF8'')) from %s t, '
                   'jsonb_populate_record(null::%s, $1) k where t.tenant_id = $2 and %s',
                   p_table, p_table, v_cond)
       into v_hash using p_row_id, p_tenant;
    return v_hash;
end
$$;
comment on function provenance.row_version(regclass, jsonb, uuid) is
    'The version (SHA-256 of the canonical image) of a row as the caller sees it, or null.';

create function provenance.receipt_hash(p_tenant uuid, p_id uuid, p_asked_by text, p_asked_at timestamptz,
                                        p_question_hash bytea, p_evidence jsonb, p_rendered_hash bytea)
    returns bytea
    language sql stable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select sha256(convert_to(jsonb_build_array(
        p_tenant::text, p_id::text, p_asked_by,
        to_char(p_asked_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        encode(p_question_hash, 'hex'), p_evidence, encode(p_rendered_hash, 'hex'))::text, 'UTF8'))
$$;
comment on function provenance.receipt_hash(uuid, uuid, text, timestamptz, bytea, jsonb, bytea) is
    'Seal of a recall receipt: SHA-256 of its canonical fields (see docs/provenance.md).';

create function provenance.tg_receipts__seal() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_item jsonb;
    v_table regclass;
    v_version bytea;
    v_clean jsonb := '[]';
begin
    if jsonb_typeof(new.evidence) is distinct from 'array' then
        raise exception 'receipt evidence must be a JSON array' using errcode = '22023';
    end if;
    for v_item in select x from jsonb_array_elements(new.evidence) as x loop
        if jsonb_typeof(v_item) <> 'object' or jsonb_typeof(v_item -> 'table') <> 'string'
           or jsonb_typeof(v_item -> 'row_id') <> 'object'
           or coalesce(v_item ->> 'version', '') !~ '^[0-9a-f]{64}$' then
            raise exception 'each evidence item needs table (text), row_id (object) and version '
                            '(64 hex digits); got %', v_item using errcode = '22023';
        end if;
        v_table := to_regclass(v_item ->> 'table');
        if v_table is null then
            raise exception 'evidence names an unknown table %', v_item ->> 'table' using errcode = '22023';
        end if;
        v_version := provenance.row_version(v_table, v_item -> 'row_id', new.tenant_id);
        if v_version is null then
            raise exception 'evidence %.% does not exist or is not visible', v_item ->> 'table',
                v_item -> 'row_id' using errcode = '23503';
        end if;
        if encode(v_version, 'hex') <> v_item ->> 'version' then
            raise exception 'evidence % % was served at version % but is now at version %',
                v_item ->> 'table', v_item -> 'row_id', v_item ->> 'version', encode(v_version, 'hex')
                using errcode = '23514';
        end if;
        v_clean := v_clean || jsonb_build_array(jsonb_build_object(
            'table', provenance.table_name(v_table), 'row_id', v_item -> 'row_id',
            'version', v_item ->> 'version'));
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
comment on function provenance.tg_receipts__seal() is
    'Checks that every evidence version is the current version of a visible row, stamps who and '
    'when, and seals the receipt with its hash.';

create function provenance.tg_derivations__versions() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_table regclass;
begin
    v_table := to_regclass(new.derived_table);
    if v_table is null then
        raise exception 'unknown derived table %', new.derived_table using errcode = '22023';
    end if;
    new.derived_table := provenance.table_name(v_table);
    new.derived_version := provenance.row_version(v_table, new.derived_row_id, new.tenant_id);
    if new.derived_version is null then
        raise exception 'derived row % % does not exist or is not visible', new.derived_table,
            new.derived_row_id using errcode = '23503';
    end if;
    if new.source_table is not null then
        v_table := to_regclass(new.source_table);
        if v_table is null then
            raise exception 'unknown source table %', new.source_table using errcode = '22023';
        end if;
        new.source_table := provenance.table_name(v_table);
        new.source_version := provenance.row_version(v_table, new.source_row_id, new.tenant_id);
        if new.source_version is null then
            raise exception 'source row % % does not exist or is not visible', new.source_table,
                new.source_row_id using errcode = '23503';
        end if;
    end if;
    new.recorded_by := auth.user_id();
    new.recorded_at := clock_timestamp();
    new.activity_id := coalesce(new.activity_id,
                                nullif(current_setting('engram.activity_id', true), '')::uuid);
    return new;
end
$$;
comment on function provenance.tg_derivations__versions() is
    'Pins the current versions of the derived and source rows (which must be visible to the writer).';

create function provenance.tg_activities__stamp() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op = 'INSERT' then
        new.actor_user := auth.user_id();
        new.actor_role := coalesce(nullif(current_setting('role', true), 'none'), session_user);
        new.started_at := clock_timestamp();
        new.ended_at := null;
    else
        if (new.tenant_id, new.id, new.kind, new.detail, new.actor_user, new.actor_role,
            new.agent_id, new.started_at)
           is distinct from (old.tenant_id, old.id, old.kind, old.detail, old.actor_user,
                             old.actor_role, old.agent_id, old.started_at) then
            raise exception 'an activity can only be ended, not changed' using errcode = '42501';
        end if;
        if old.ended_at is not null then
            raise exception 'activity % has already ended', old.id using errcode = '22023';
        end if;
    end if;
    return new;
end
$$;
comment on function provenance.tg_activities__stamp() is
    'Stamps who started an activity and when; afterwards only ended_at may be set, once.';

create function provenance.begin_activity(p_kind text, p_detail jsonb default '{}',
                                          p_agent uuid default null) returns uuid
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_id uuid := uuidv7();
begin
    if auth.tenant_id() is null then
        raise exception 'no identity is bound; an activity belongs to a tenant' using errcode = '28000';
    end if;
    -- Set first, so that the activity's own chain event names it.
    perform set_config('engram.activity_id', v_id::text, true);
    insert into provenance.activities (id, kind, detail, agent_id)
    values (v_id, p_kind, coalesce(p_detail, '{}'), p_agent);
    return v_id;
end
$$;
comment on function provenance.begin_activity(text, jsonb, uuid) is
    'Starts an activity (ingest run, API request, job) for the rest of the transaction: every chain '
    'event, derivation and receipt written after it names it.';

create function provenance.end_activity(p_id uuid default null) returns void
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_id uuid := coalesce(p_id, nullif(current_setting('engram.activity_id', true), '')::uuid);
begin
    if v_id is null then
        raise exception 'no activity is running in this transaction' using errcode = 'P0002';
    end if;
    update provenance.activities a set ended_at = clock_timestamp() where a.id = v_id;
    if not found then
        raise exception 'activity % does not exist or is not yours', v_id using errcode = 'P0002';
    end if;
    if v_id::text = current_setting('engram.activity_id', true) then
        perform set_config('engram.activity_id', '', true);
    end if;
end
$$;
comment on function provenance.end_activity(uuid) is 'Ends an activity (default: the running one).';
"""

# Functions owned by engram_verifier: they read memory rows (through the
# verifier's SELECT policies) and return only keys and hashes.
VERIFIER_SQL = r"""
-- SECURITY DEFINER as engram_verifier: an auditor may learn whether rows match
-- the chain, never what they contain.
create function provenance.verify_rows(p_tenant uuid default null)
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
             cross join lateral (select case
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
comment on function provenance.verify_rows(uuid) is
    'Compares every current row of the chained tables with its latest chain event: rows changed, '
    'inserted or deleted without an event. Returns keys and hashes only.';

create function provenance.audit_row_version(p_table text, p_row_id jsonb, p_tenant uuid)
    returns bytea
    language plpgsql stable security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    -- Resolved here, as the verifier: auditors have no USAGE on the memory schemas.
    v_table regclass := to_regclass(p_table);
begin
    if v_table is null then
        raise exception 'unknown table %', p_table using errcode = '22023';
    end if;
    return provenance.row_version(v_table, p_row_id, p_tenant);
end
$$;
comment on function provenance.audit_row_version(text, jsonb, uuid) is
    'For auditors: the current version hash of any tenant''s row (hash only).';

-- Before the hand-over: only the owner of the moment can revoke PUBLIC's EXECUTE,
-- and ALTER ... OWNER carries the ACL over to the new owner.
revoke all on function provenance.verify_rows(uuid), provenance.audit_row_version(text, jsonb, uuid)
    from public;
grant execute on function provenance.verify_rows(uuid), provenance.audit_row_version(text, jsonb, uuid)
    to engram_auditor;
"""

POLICIES_SQL = """
alter table provenance.events enable row level security;
alter table provenance.events force row level security;
create policy events__select_owner on provenance.events for select to engram_owner using (true);
create policy events__insert_owner on provenance.events for insert to engram_owner with check (true);
create policy events__select_auditor on provenance.events for select to engram_auditor using (true);
create policy events__select_verifier on provenance.events for select to engram_verifier using (true);
-- The owner keeps SELECT and INSERT only; nobody else gets any write privilege.
revoke update, delete, truncate on provenance.events from engram_owner;
grant select on provenance.events to engram_auditor, engram_verifier;

create trigger tg_events__append_only before update or delete on provenance.events
    for each row execute function provenance.tg_append_only__refuse();
create trigger tg_events__no_truncate before truncate on provenance.events
    for each statement execute function provenance.tg_append_only__refuse();
create trigger tg_derivations__append_only before update or delete on provenance.derivations
    for each row execute function provenance.tg_append_only__refuse();
create trigger tg_derivations__no_truncate before truncate on provenance.derivations
    for each statement execute function provenance.tg_append_only__refuse();
create trigger tg_receipts__append_only before update or delete on provenance.receipts
    for each row execute function provenance.tg_append_only__refuse();
create trigger tg_receipts__no_truncate before truncate on provenance.receipts
    for each statement execute function provenance.tg_append_only__refuse();
create trigger tg_receipts__seal before insert on provenance.receipts
    for each row execute function provenance.tg_receipts__seal();
create trigger tg_derivations__versions before insert on provenance.derivations
    for each row execute function provenance.tg_derivations__versions();
create trigger tg_activities__stamp before insert or update on provenance.activities
    for each row execute function provenance.tg_activities__stamp();

alter table provenance.pending enable row level security;
alter table provenance.pending force row level security;
alter table provenance.pending_commits enable row level security;
alter table provenance.pending_commits force row level security;
create policy pending__all_owner on provenance.pending for all to engram_owner using (true) with check (true);
create policy pending_commits__all_owner on provenance.pending_commits for all to engram_owner
    using (true) with check (true);
create constraint trigger tg_pending_commits__chain after insert on provenance.pending_commits
    deferrable initially deferred
    for each row execute function provenance.tg_pending_commits__chain();
comment on table provenance.pending is
    'Events staged by the chain trigger during a transaction; chained and removed at its commit.';
comment on table provenance.pending_commits is
    'One row per tenant and transaction with staged events: fires the commit-time chaining.';
comment on sequence provenance.pending_ord is 'Order of staged events within a transaction.';

alter table provenance.agents enable row level security;
alter table provenance.agents force row level security;
alter table provenance.activities enable row level security;
alter table provenance.activities force row level security;
alter table provenance.derivations enable row level security;
alter table provenance.derivations force row level security;
alter table provenance.receipts enable row level security;
alter table provenance.receipts force row level security;

create policy agents__select_app on provenance.agents for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy agents__insert_app on provenance.agents for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()));
create policy agents__select_auditor on provenance.agents for select to engram_auditor using (true);

create policy activities__select_app on provenance.activities for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy activities__insert_app on provenance.activities for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()));
create policy activities__update_app on provenance.activities for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and actor_user = (select auth.user_id()))
    with check (tenant_id = (select auth.tenant_id()) and actor_user = (select auth.user_id()));
create policy activities__select_auditor on provenance.activities for select to engram_auditor
    using (true);
-- The chain trigger (running as the owner) checks that an event's activity exists.
create policy activities__select_owner on provenance.activities for select to engram_owner
    using (true);

create policy derivations__select_app on provenance.derivations for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy derivations__insert_app on provenance.derivations for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()));
create policy derivations__select_auditor on provenance.derivations for select to engram_auditor
    using (true);

create policy receipts__select_app on provenance.receipts for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy receipts__insert_app on provenance.receipts for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and asked_by = (select auth.user_id()));
create policy receipts__select_auditor on provenance.receipts for select to engram_auditor
    using (true);

grant usage on schema provenance to engram_app, engram_auditor, engram_verifier;
-- Auditors name tenants by organization id; they see no other tenant column.
grant select (id, org_id) on auth.tenants to engram_auditor;
create policy tenants__select_auditor on auth.tenants for select to engram_auditor using (true);
grant select on provenance.agents, provenance.activities, provenance.derivations, provenance.receipts
    to engram_app, engram_auditor;
grant insert (kind, name, version) on provenance.agents to engram_app;
grant insert (id, kind, detail, agent_id), update (ended_at) on provenance.activities to engram_app;
grant insert (relation, derived_table, derived_row_id, source_table, source_row_id, source_agent_id,
              activity_id)
    on provenance.derivations to engram_app;
grant insert (question_hash, evidence, rendered_hash, activity_id) on provenance.receipts to engram_app;

grant execute on function provenance.row_version(regclass, jsonb, uuid) to engram_verifier;

comment on schema provenance is
    'The per-tenant hash chain, PROV-O agents, activities and derivations, and recall receipts.';
comment on table provenance.events is
    'Append-only per-tenant hash chain: one event per written memory row (trigger-maintained).';
comment on column provenance.events.row_id is 'Primary key of the row without tenant_id, as jsonb.';
comment on column provenance.events.row_hash is 'SHA-256 of the canonical row image (new row; old row for DELETE).';
comment on column provenance.events.hash is 'sha256(prev_hash || provenance.event_body(...)).';
comment on column provenance.events.actor_role is 'The session''s SET ROLE, else its login role.';
comment on table provenance.agents is 'PROV agents: persons, software and models (with version).';
comment on table provenance.activities is
    'PROV activities: ingest runs, API requests, jobs; who started them, when they started and ended.';
comment on table provenance.derivations is
    'Append-only PROV derivation edges between row versions, or from an agent (an embedding from its model).';
comment on table provenance.receipts is
    'Append-only recall receipts: who asked, when, the evidence versions served, the rendered hash.';
"""


def _uuid(name: str, *, default: str | None = None, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, postgresql.UUID(as_uuid=True),
                     server_default=sa.text(default) if default else None, nullable=nullable)


def upgrade() -> None:
    op.execute("reset role")
    op.execute(ROLE_SQL)
    op.execute("set role engram_owner")
    op.execute("create schema provenance authorization engram_owner")

    ts = sa.DateTime(timezone=True)
    op.create_table(
        "events",
        _uuid("tenant_id"),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", ts, nullable=False),
        sa.Column("table_name", sa.Text(), nullable=False),
        sa.Column("row_id", postgresql.JSONB(), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("actor_user", sa.Text(), nullable=True),
        sa.Column("actor_role", sa.Text(), nullable=False),
        _uuid("activity_id", nullable=True),
        sa.Column("row_hash", postgresql.BYTEA(), nullable=False),
        sa.Column("prev_hash", postgresql.BYTEA(), nullable=False),
        sa.Column("hash", postgresql.BYTEA(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "seq", name="pk_events"),
        sa.CheckConstraint("seq >= 1", name="ck_events_seq_positive"),
        sa.CheckConstraint("operation in ('INSERT', 'UPDATE', 'DELETE', 'BASELINE')",
                           name="ck_events_operation_known"),
        sa.CheckConstraint("length(row_hash) = 32 and length(prev_hash) = 32 and length(hash) = 32",
                           name="ck_events_hash_lengths"),
        sa.CheckConstraint("jsonb_typeof(row_id) = 'object'", name="ck_events_row_id_object"),
        schema="provenance",
    )
    op.create_index("ix_events_tenant_id_table_name_row_id_seq", "events",
                    ["tenant_id", "table_name", "row_id", "seq"], schema="provenance")
    op.create_index("ix_events_tenant_id_activity_id", "events", ["tenant_id", "activity_id"],
                    schema="provenance", postgresql_where=sa.text("activity_id is not null"))

    op.execute("create sequence provenance.pending_ord as bigint")
    op.create_table(
        "pending",
        _uuid("tenant_id"),
        sa.Column("txid", sa.BigInteger(), nullable=False),
        sa.Column("ord", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", ts, nullable=False),
        sa.Column("table_name", sa.Text(), nullable=False),
        sa.Column("row_id", postgresql.JSONB(), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("actor_user", sa.Text(), nullable=True),
        sa.Column("actor_role", sa.Text(), nullable=False),
        _uuid("activity_id", nullable=True),
        sa.Column("row_hash", postgresql.BYTEA(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "txid", "ord", name="pk_pending"),
        schema="provenance",
        # Unlogged: a staged row lives only inside its writing transaction, which a
        # crash aborts anyway; the chained event in provenance.events is logged.
        prefixes=["UNLOGGED"],
    )
    op.create_table(
        "pending_commits",
        _uuid("tenant_id"),
        sa.Column("txid", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "txid", name="pk_pending_commits"),
        schema="provenance",
        prefixes=["UNLOGGED"],
    )
    op.create_table(
        "agents",
        _uuid("tenant_id", default="auth.tenant_id()"),
        _uuid("id", default="uuidv7()"),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("created_at", ts, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_agents"),
        sa.UniqueConstraint("tenant_id", "kind", "name", "version", name="uq_agents_tenant_id_kind_name_version"),
        sa.CheckConstraint("kind in ('person', 'software', 'model', 'organization')", name="ck_agents_kind_known"),
        sa.CheckConstraint("length(name) between 1 and 300", name="ck_agents_name_length"),
        sa.CheckConstraint("length(version) <= 100", name="ck_agents_version_length"),
        schema="provenance",
    )
    op.create_table(
        "activities",
        _uuid("tenant_id", default="auth.tenant_id()"),
        _uuid("id", default="uuidv7()"),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("detail", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("actor_user", sa.Text(), nullable=True),
        sa.Column("actor_role", sa.Text(), nullable=False),
        _uuid("agent_id", nullable=True),
        sa.Column("started_at", ts, server_default=sa.text("clock_timestamp()"), nullable=False),
        sa.Column("ended_at", ts, nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_activities"),
        sa.ForeignKeyConstraint(["tenant_id", "agent_id"], ["provenance.agents.tenant_id", "provenance.agents.id"],
                                name="fk_activities_tenant_id_agent_id_agents"),
        sa.CheckConstraint(r"kind ~ '^[a-z][a-z0-9_.:-]{0,62}$'", name="ck_activities_kind_format"),
        sa.CheckConstraint("jsonb_typeof(detail) = 'object'", name="ck_activities_detail_object"),
        sa.CheckConstraint("ended_at is null or ended_at >= started_at", name="ck_activities_ended_after_start"),
        schema="provenance",
    )
    op.create_table(
        "derivations",
        _uuid("tenant_id", default="auth.tenant_id()"),
        _uuid("id", default="uuidv7()"),
        sa.Column("relation", sa.Text(), server_default=sa.text("'wasDerivedFrom'"), nullable=False),
        sa.Column("derived_table", sa.Text(), nullable=False),
        sa.Column("derived_row_id", postgresql.JSONB(), nullable=False),
        sa.Column("derived_version", postgresql.BYTEA(), nullable=False),
        sa.Column("source_table", sa.Text(), nullable=True),
        sa.Column("source_row_id", postgresql.JSONB(), nullable=True),
        sa.Column("source_version", postgresql.BYTEA(), nullable=True),
        _uuid("source_agent_id", nullable=True),
        _uuid("activity_id", nullable=True),
        sa.Column("recorded_by", sa.Text(), nullable=True),
        sa.Column("recorded_at", ts, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_derivations"),
        sa.ForeignKeyConstraint(["tenant_id", "source_agent_id"],
                                ["provenance.agents.tenant_id", "provenance.agents.id"],
                                name="fk_derivations_tenant_id_source_agent_id_agents"),
        sa.CheckConstraint(
            "relation in ('wasDerivedFrom', 'wasQuotedFrom', 'wasRevisionOf', 'hadPrimarySource')",
            name="ck_derivations_relation_known"),
        sa.CheckConstraint(
            "(source_table is null) = (source_row_id is null) "
            "and (source_table is null) <> (source_agent_id is null)",
            name="ck_derivations_one_source"),
        schema="provenance",
    )
    op.create_index("ix_derivations_tenant_id_derived", "derivations",
                    ["tenant_id", "derived_table", "derived_row_id"], schema="provenance")
    op.create_index("ix_derivations_tenant_id_source", "derivations",
                    ["tenant_id", "source_table", "source_row_id"], schema="provenance")
    op.create_table(
        "receipts",
        _uuid("tenant_id", default="auth.tenant_id()"),
        _uuid("id", default="uuidv7()"),
        sa.Column("asked_by", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=False),
        sa.Column("asked_at", ts, server_default=sa.text("clock_timestamp()"), nullable=False),
        sa.Column("question_hash", postgresql.BYTEA(), nullable=False),
        sa.Column("evidence", postgresql.JSONB(), nullable=False),
        sa.Column("rendered_hash", postgresql.BYTEA(), nullable=False),
        _uuid("activity_id", nullable=True),
        sa.Column("receipt_hash", postgresql.BYTEA(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_receipts"),
        sa.CheckConstraint("length(question_hash) = 32 and length(rendered_hash) = 32",
                           name="ck_receipts_hash_lengths"),
        sa.CheckConstraint("jsonb_typeof(evidence) = 'array'", name="ck_receipts_evidence_array"),
        schema="provenance",
    )

    op.execute(FUNCTIONS_SQL)
    # Functions the verifier owns: created by the owner, then handed over.
    op.execute("grant create on schema provenance to engram_verifier")
    op.execute(VERIFIER_SQL)
    op.execute("alter function provenance.verify_rows(uuid) owner to engram_verifier")
    op.execute("alter function provenance.audit_row_version(text, jsonb, uuid) owner to engram_verifier")
    op.execute("revoke create on schema provenance from engram_verifier")
    op.execute(POLICIES_SQL)

    bind = op.get_bind()
    tables = [row[0] for row in bind.execute(sa.text(
        "select c.oid::regclass::text from pg_class c join pg_namespace n on n.oid = c.relnamespace "
        "where n.nspname = any(:schemas) and c.relkind in ('r', 'p') and not c.relispartition "
        "and exists (select 1 from pg_attribute a where a.attrelid = c.oid and a.attname = 'tenant_id' "
        "and not a.attisdropped) order by 1"), {"schemas": list(MEMORY_SCHEMAS)})]
    tables += [f"provenance.{t}" for t in CHAINED_OWN_TABLES]
    for table in tables:
        op.execute(sa.text("select provenance.attach_chain(cast(:t as regclass))").bindparams(t=table))
    # Rows written before this revision: a BASELINE event each. Only the migrating
    # superuser sees every row (FORCE RLS hides them from the owner).
    op.execute("reset role")
    for table in tables:
        op.execute(sa.text("select provenance.baseline(cast(:t as regclass))").bindparams(t=table))
    op.execute("set role engram_owner")


def downgrade() -> None:
    op.execute("set role engram_owner")
    bind = op.get_bind()
    for (table,) in bind.execute(sa.text("select provenance.chained_tables()::text")).all():
        if table.startswith("provenance."):
            continue
        name = table.split(".")[-1]
        for task in ("chain_insert", "chain_update", "chain_delete"):
            op.execute(f"drop trigger if exists tg_{name}__{task} on {table}")
        op.execute(f"drop policy if exists {name}__select_verifier on {table}")
        op.execute(f"revoke all on {table} from engram_verifier")
    for schema in MEMORY_SCHEMAS:
        op.execute(
            f"do $r$ begin if exists (select 1 from pg_namespace where nspname = '{schema}') then "
            f"execute 'revoke all on schema {schema} from engram_verifier'; end if; end $r$"
        )
    op.execute("drop policy if exists tenants__select_auditor on auth.tenants")
    op.execute("revoke select (id, org_id) on auth.tenants from engram_auditor")
    op.execute("drop schema provenance cascade")
    # engram_verifier is cluster-wide and may serve other databases: left in place, like 0001's roles.
