-- The identity functions every policy calls are PL/pgSQL (0088_identity_functions_plpgsql):
-- cheaper per call site, and returning exactly what the SQL bodies returned: nothing bound,
-- a bound reader and writer, a bound service, and settings left empty by a rebind.
begin;
select plan(14);

select is((select array_agg(p.proname::text || ' ' || l.lanname order by p.proname)
             from pg_proc p join pg_language l on l.oid = p.prolang
            where p.pronamespace = 'auth'::regnamespace
              and p.proname in ('tenant_id', 'user_id', 'write_scopes', 'read_scopes', 'is_service')),
          array['is_service plpgsql', 'read_scopes plpgsql', 'tenant_id plpgsql',
                'user_id plpgsql', 'write_scopes plpgsql'],
          'the five identity functions are PL/pgSQL');
select ok((select bool_and(p.provolatile = 's' and p.proparallel = 's' and not p.prosecdef
                           and p.proconfig @> array['search_path=pg_catalog, pg_temp'])
             from pg_proc p
            where p.pronamespace = 'auth'::regnamespace
              and p.proname in ('tenant_id', 'user_id', 'write_scopes', 'read_scopes', 'is_service')),
          'stable, parallel safe, security invoker, with their search path pinned');

select tests.make_tenant('t-idf', array['team', 'exec']);
select tests.make_tenant('t-idf2', array['team']);
create temp table idf as
    select (select id from auth.tenants where org_id = 't-idf') as tenant,
           (select s.id from auth.scopes s join auth.tenants t on t.id = s.tenant_id
             where t.org_id = 't-idf' and s.name = 'team') as team,
           (select s.id from auth.scopes s join auth.tenants t on t.id = s.tenant_id
             where t.org_id = 't-idf' and s.name = 'exec') as exec;
grant select on idf to public;

select tests.act_as_nobody();
select is(auth.tenant_id(), null, 'nothing bound: no tenant');
select is(auth.user_id(), null, 'nothing bound: no user');
select is(auth.read_scopes(), '{}'::uuid[], 'nothing bound: no read scope');
select is(auth.write_scopes(), '{}'::uuid[], 'nothing bound: no write scope');
select is(auth.is_service(), false, 'nothing bound: not the service');
reset role;

select tests.act_as('t-idf', 'alice', array['team'], array['exec']);
select is(auth.tenant_id(), (select tenant from idf), 'bound: the tenant');
select is(auth.user_id(), 'alice', 'bound: the user');
select is(auth.write_scopes(), array[(select exec from idf)], 'bound: the write scopes');
select is(auth.read_scopes(), array[(select team from idf), (select exec from idf)],
          'bound: the read scopes, then the write scopes (write implies read)');
select is(auth.is_service(), false, 'a user is not the service');
reset role;

select auth.bind_service_identity('t-idf', array['team']);
select is(auth.is_service(), true, 'bound by bind_service_identity: the service');
select auth.bind_identity('t-idf2', 'service:derive', '{}', array['team']);
select is(auth.is_service(), false, 'rebound to another tenant, even as service:derive: not the service');

select * from finish();
rollback;
