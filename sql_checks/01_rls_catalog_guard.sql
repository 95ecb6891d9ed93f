-- Catalog guard: every table in Engram's schemas has row level security
-- enabled and forced, and every view is security_barrier + security_invoker.
-- A future migration that forgets either fails here.
begin;
select plan(5);

create temp view engram_schemas as
    select n.oid, n.nspname from pg_namespace n
     where pg_get_userbyid(n.nspowner) = 'engram_owner';

select ok((select count(*) from engram_schemas) >= 3, 'Engram owns its schemas (auth, engram, sources, ...)');

select is_empty($$
    select n.nspname || '.' || c.relname from pg_class c join engram_schemas n on n.oid = c.relnamespace
     where c.relkind in ('r', 'p') and not c.relrowsecurity
$$, 'every Engram table has row level security enabled');

select is_empty($$
    select n.nspname || '.' || c.relname from pg_class c join engram_schemas n on n.oid = c.relnamespace
     where c.relkind in ('r', 'p') and not c.relforcerowsecurity
$$, 'every Engram table forces row level security (owner included)');

select is_empty($$
    select n.nspname || '.' || c.relname from pg_class c join engram_schemas n on n.oid = c.relnamespace
     where c.relkind = 'v'
       and not (coalesce(c.reloptions, '{}') @> array['security_barrier=true']
                and coalesce(c.reloptions, '{}') @> array['security_invoker=true'])
$$, 'every Engram view is security_barrier and security_invoker');

select is_empty($$
    select c.relname from pg_class c join engram_schemas n on n.oid = c.relnamespace
     where c.relkind in ('r', 'p', 'v') and pg_get_userbyid(c.relowner) <> 'engram_owner'
$$, 'engram_owner owns every Engram table and view (engram_app owns nothing)');

select * from finish();
rollback;
