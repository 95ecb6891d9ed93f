-- Roles and the auth schema: the app role cannot bypass RLS, sees only its
-- bound tenant and that tenant's scopes, and cannot administer anything.
begin;
select plan(20);

select tests.make_tenant('t-auth-a', array['team', 'private']);
select tests.make_tenant('t-auth-b', array['team']);

select ok(not rolsuper and not rolbypassrls and rolcanlogin, 'engram_app: LOGIN, not superuser, no BYPASSRLS')
  from pg_roles where rolname = 'engram_app';
select ok(not rolsuper and not rolbypassrls, 'engram_auditor has no BYPASSRLS')
  from pg_roles where rolname = 'engram_auditor';
select ok(not rolbypassrls and not rolcanlogin, 'engram_dba is a NOLOGIN group role without BYPASSRLS')
  from pg_roles where rolname = 'engram_dba';
select is((select count(*)::int from pg_class where pg_get_userbyid(relowner) = 'engram_app'), 0,
          'engram_app owns no relation');

-- No identity bound: nothing is visible.
select tests.act_as_nobody();
select is_empty('select * from auth.tenants', 'no identity: no tenant visible');
select is_empty('select * from auth.scopes', 'no identity: no scope visible');
reset role;

-- Bound as tenant A.
select tests.act_as('t-auth-a', 'alice', array['team'], array[]::text[]);
select results_eq('select org_id from auth.tenants', $$values ('t-auth-a')$$, 'a bound user sees its own tenant only');
select results_eq('select name from auth.scopes order by name', $$values ('private'), ('team')$$,
                  'a bound user sees the scopes of its tenant only');
select throws_ok($$insert into auth.tenants (org_id, name) values ('evil', 'evil')$$, '42501', null,
                 'engram_app cannot create tenants');
select throws_ok($$insert into auth.scopes (tenant_id, name) values (auth.tenant_id(), 'mine')$$, '42501', null,
                 'engram_app cannot create scopes');
select throws_ok($$update auth.scopes set description = 'x'$$, '42501', null, 'engram_app cannot edit scopes');
select throws_ok($$alter policy scopes__select_app on auth.scopes using (true)$$, '42501', null,
                 'engram_app cannot alter policies');
select throws_ok($$alter table auth.scopes disable row level security$$, '42501', null,
                 'engram_app cannot disable row level security');
reset role;

select tests.act_as_nobody();
select throws_ok($$select auth.bind_identity('no-such-org', 'mallory', '{}', '{}')$$, '28000',
                 'unknown tenant (organization) ''no-such-org''', 'binding an unknown tenant is refused');
select throws_ok($$select auth.bind_identity('t-auth-a', 'mallory', array['nope'], '{}')$$, '42501',
                 'unknown scope(s) for tenant ''t-auth-a'': nope', 'binding an unknown scope is refused');
select throws_ok($$select auth.bind_identity('t-auth-b', 'mallory', array['private'], '{}')$$, '42501', null,
                 'a scope of another tenant cannot be bound');
select throws_ok($$select auth.bind_identity('t-auth-a', '', '{}', '{}')$$, '28000', 'no user given',
                 'binding without a user is refused');
reset role;

-- The DBA role administers tenants and scopes.
select tests.act_as_dba();
select lives_ok($$select auth.create_scope(tests.tenant('t-auth-b'), 'ops', 'Operations')$$,
                'engram_dba creates a scope');
select is((select count(*)::int from auth.tenants where org_id like 't-auth-%'), 2, 'engram_dba sees every tenant');
select throws_ok($$select * from sources.documents$$, '42501', null, 'engram_dba cannot read documents');
reset role;

select * from finish();
rollback;
