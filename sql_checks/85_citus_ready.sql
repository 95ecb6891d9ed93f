-- Citus-ready sharding by tenant, checked from the catalog (docs/scale-out.md).
--
-- Distributing a table by tenant_id (create_distributed_table, colocated) needs every
-- primary key and unique constraint to include tenant_id, and every foreign key between
-- distributed tables to carry tenant_id on both sides; a foreign key may also point at a
-- reference table (the shared tables, replicated to every node), never from one. A
-- statement then stays on one shard when it names one tenant.
--
-- "Hot path" here means every function a request or a write can run, concretely:
--   (a) every function engram_app may execute (requests and recalls run as engram_app;
--       the recall statement's functions are among them),
--   (b) every trigger function of a tenant table (they run inside every write, whoever
--       writes), and
--   (c) every function a policy of a tenant table calls (they run inside every read).
-- A function "can read across tenants" when it runs as a role that sees more than one
-- tenant's rows of a table it names: a SECURITY DEFINER function whose owner is a
-- superuser, bypasses RLS, or holds a policy on that table that does not test tenant_id.
-- SECURITY INVOKER functions run as the caller, and engram_app's policies all test
-- tenant_id (checked below). The few definer functions that can are listed here, each
-- reviewed: every statement in them is keyed by one tenant (NEW/OLD.tenant_id, or the
-- statement's own rows grouped by tenant_id), or, for a batch job over every tenant, the job
-- only lists the tenants with work and then runs each statement for one tenant at a time
-- (a router query each under Citus). A new one fails this file until reviewed.
begin;
select plan(14);

create temp view engram_schemas as
    select n.oid, n.nspname from pg_namespace n
     where pg_get_userbyid(n.nspowner) = 'engram_owner';

create temp view engram_tables as
    select c.oid as relid, n.nspname || '.' || c.relname as name,
           (select a.attnum from pg_attribute a
             where a.attrelid = c.oid and a.attname = 'tenant_id' and not a.attisdropped) as tenant_col
      from pg_class c join engram_schemas n on n.oid = c.relnamespace
     where c.relkind in ('r', 'p');

create temp view tenant_tables as select * from engram_tables where tenant_col is not null;
create temp view shared_tables as select * from engram_tables where tenant_col is null;

-- Constraint columns by name, in key order.
create function pg_temp.cols(p_rel oid, p_keys int2[]) returns text[] language sql stable as $$
    select array_agg(a.attname::text order by k.ord)
      from unnest(p_keys) with ordinality as k(n, ord)
      join pg_attribute a on a.attrelid = p_rel and a.attnum = k.n
$$;

-- Roles that see more than one tenant's rows of a tenant table, per table.
create temp view unbounded as
    select r.oid as roleid, r.rolname, t.relid, t.name
      from pg_roles r cross join tenant_tables t
     where r.rolsuper or r.rolbypassrls
        or exists (select 1 from pg_policy po
                    where po.polrelid = t.relid
                      and (r.oid = any(po.polroles) or 0::oid = any(po.polroles))
                      and coalesce(pg_get_expr(po.polqual, po.polrelid), '') !~ 'tenant_id'
                      and coalesce(pg_get_expr(po.polwithcheck, po.polrelid), '') !~ 'tenant_id');

create function pg_temp.hot_path() returns table (fn oid) language sql stable as $$
    select p.oid from pg_proc p join engram_schemas n on n.oid = p.pronamespace
     where has_function_privilege('engram_app', p.oid, 'execute')
    union
    select tg.tgfoid from pg_trigger tg join tenant_tables t on t.relid = tg.tgrelid
     where not tg.tgisinternal
    union
    select d.refobjid from pg_depend d
      join pg_policy po on d.classid = 'pg_policy'::regclass and d.objid = po.oid
      join tenant_tables t on t.relid = po.polrelid
     where d.refclassid = 'pg_proc'::regclass
$$;

-- Hot-path functions that can read across tenants, with the tables they could.
create function pg_temp.cross_tenant() returns table (fn text, tables text) language sql stable as $$
    select p.oid::regprocedure::text, string_agg(u.name, ', ' order by u.name)
      from pg_temp.hot_path() h
      join pg_proc p on p.oid = h.fn
      join unbounded u on u.roleid = p.proowner
     where p.prosecdef and p.prosrc ~* ('\m' || replace(u.name, '.', '\.') || '\M')
     group by 1
$$;

select set_eq($$ select name from shared_tables $$,
    array['auth.tenants', 'engram.installation', 'worker.embedding_models'],
    'the tables without tenant_id are the three shared (reference) tables');

select is_empty($$ select name from tenant_tables t join pg_attribute a
                      on a.attrelid = t.relid and a.attnum = t.tenant_col where not a.attnotnull $$,
    'tenant_id is NOT NULL in every tenant table (a distribution column never is null)');

select is_empty($$
    select t.name from tenant_tables t
     where not exists (select 1 from pg_constraint c where c.conrelid = t.relid and c.contype = 'p')
$$, 'every tenant table has a primary key');

select is_empty($$
    select t.name || ' ' || c.conname from tenant_tables t
      join pg_constraint c on c.conrelid = t.relid and c.contype = 'p'
     where c.conkey[1] <> t.tenant_col
$$, 'every tenant table''s primary key leads with tenant_id');

select is_empty($$
    select t.name || ' ' || ic.relname from tenant_tables t
      join pg_index i on i.indrelid = t.relid and i.indisunique
      join pg_class ic on ic.oid = i.indexrelid
     where not (t.tenant_col = any(i.indkey::int2[]))
$$, 'every unique constraint and unique index of a tenant table includes tenant_id');

select is_empty($$
    select t.name || ' ' || c.conname from tenant_tables t
      join pg_constraint c on c.conrelid = t.relid and c.contype = 'x'
     where not (t.tenant_col = any(c.conkey))
$$, 'every exclusion constraint of a tenant table includes tenant_id');

select is_empty($$
    select t.name || ' ' || c.conname || ' ' || array_to_string(pg_temp.cols(c.conrelid, c.conkey), ',')
           || ' -> ' || c.confrelid::regclass::text
      from tenant_tables t
      join pg_constraint c on c.conrelid = t.relid and c.contype = 'f'
     where c.confrelid not in (select relid from shared_tables)
       and not exists (
           select 1 from tenant_tables r, generate_subscripts(c.conkey, 1) as k(i)
            where r.relid = c.confrelid and c.conkey[k.i] = t.tenant_col
              and c.confkey[k.i] = r.tenant_col)
$$, 'every foreign key between tenant tables maps tenant_id to tenant_id (others point at a shared table)');

select is_empty($$
    select s.name || ' ' || c.conname from shared_tables s
      join pg_constraint c on c.conrelid = s.relid and c.contype = 'f'
     where c.confrelid in (select relid from tenant_tables)
$$, 'no shared (reference) table has a foreign key into a tenant table');

select is_empty($$ select rolname from pg_roles
                    where rolname = 'engram_app' and (rolsuper or rolbypassrls) $$,
    'engram_app neither is a superuser nor bypasses row level security');

select is_empty($$ select name from unbounded where rolname = 'engram_app' $$,
    'every policy that gives engram_app a tenant table tests tenant_id (invoker functions stay in the tenant)');

select set_eq($$ select fn from pg_temp.cross_tenant() $$,
    array['provenance.tg_chain__append()', 'provenance.tg_pending_commits__chain()',
          'recall.tg_chunks__lexical_stats()', 'recall.tg_tenants__purge_lexical_stats()',
          -- 0041: reads only the statement's own chunks (new_rows/old_rows, an update's two
          -- sides matched on tenant_id and id) and appends one delta per tenant_id and scope set.
          'recall.tg_chunks__lexical_terms()',
          -- 0040: checks the activity with a.tenant_id = n.tenant_id and queues each new receipt
          -- under its own tenant_id, reading only the statement's new_rows.
          'provenance.tg_receipts__queue_chain()',
          -- 0040: a batch job over every tenant: one query lists the tenants with queued receipts
          -- (ids only), then each statement (chain lock, chain head, queue read, events insert,
          -- queue delete) is keyed by that one tenant_id; it returns only a count.
          'provenance.chain_receipts(integer)'],
    'the hot-path functions that could read across tenants are exactly the reviewed seven');

select is_empty($$
    select f.fn from pg_temp.cross_tenant() f join pg_proc p on p.oid::regprocedure::text = f.fn
     where p.prosrc !~ 'tenant_id'
$$, 'each of them keys its statements by tenant_id');

-- Negative controls: a table keyed without tenant_id and a definer function that counts
-- every tenant's events are both caught (the transaction is rolled back).
create table memory.citus_probe_keys (tenant_id uuid not null, id uuid primary key);
select isnt_empty($$
    select t.name from tenant_tables t
      join pg_constraint c on c.conrelid = t.relid and c.contype = 'p'
     where c.conkey[1] <> t.tenant_col and t.name = 'memory.citus_probe_keys'
$$, 'negative control: a primary key without tenant_id is found');

create function memory.citus_probe_count() returns bigint language sql security definer
    as $$ select count(*) from provenance.events $$;
alter function memory.citus_probe_count() owner to engram_owner;
select results_eq(
    $$ select tables from pg_temp.cross_tenant() where fn = 'memory.citus_probe_count()' $$,
    array['provenance.events'],
    'negative control: a definer function reading every tenant''s events is found on the hot path');

select * from finish();
rollback;
