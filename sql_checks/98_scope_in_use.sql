-- A scope that rows are still shared into cannot be deleted (migration 0093): the rows would
-- keep an id no scope has, readable by no one. An empty scope can be; a tenant's deletion
-- still takes its scopes and rows with it. auth.scope_holders names tables, for DBAs only.
begin;
select plan(13);

select tests.make_tenant('t-siu-a', array['team', 'hr', 'exec', 'spare']);
select tests.make_tenant('t-siu-b', array['team']);
select tests.make_document('t-siu-a', 'team.md', array['team']);
select tests.make_document('t-siu-a', 'shared.md', array['hr', 'exec']);
create temp table siu_tenant on commit drop as select tests.tenant('t-siu-a') as id;

select tests.act_as_dba();
select throws_ok($$delete from auth.scopes where tenant_id = tests.tenant('t-siu-a') and name = 'team'$$,
                 '55006',
                 'scope ''team'' of organization ''t-siu-a'' still holds rows (in sources.chunks, sources.documents): deleting it would leave them readable by no one; have their writers delete them or share them into another scope first',
                 'a DBA cannot delete a scope a document is shared into, and is told which tables hold rows');
select throws_ok($$delete from auth.scopes where tenant_id = tests.tenant('t-siu-a') and name = 'exec'$$,
                 '55006', null,
                 'nor a scope that is one of a row''s several scopes');
select is(auth.scope_holders(tests.tenant('t-siu-a'), tests.scope('t-siu-a', 'hr')),
          array['sources.chunks', 'sources.documents'], 'scope_holders names the tables holding the scope''s rows');
select is(auth.scope_holders(tests.tenant('t-siu-b'), tests.scope('t-siu-b', 'team')),
          array[]::text[], 'another tenant''s scope of the same name holds nothing of this one''s');
select is((select count(*)::int from auth.scopes where tenant_id = tests.tenant('t-siu-a')), 4,
          'the refused deletes removed no scope');
select lives_ok($$delete from auth.scopes where tenant_id = tests.tenant('t-siu-a') and name = 'spare'$$,
                'a scope no row is shared into can be deleted');
select lives_ok($$delete from auth.scopes where tenant_id = tests.tenant('t-siu-b') and name = 'team'$$,
                'and so can a scope of a tenant that holds no rows');
reset role;

select tests.act_as('t-siu-a', 'alice', array['team'], array['team']);
select results_eq('select path from sources.documents', $$values ('team.md')$$,
                  'the refused delete left the rows readable as before');
select throws_ok($$select auth.scope_holders(auth.tenant_id(), tests.scope('t-siu-a', 'team'))$$,
                 '42501', null, 'the application cannot ask which tables hold a scope''s rows');
delete from sources.documents where path = 'team.md';
reset role;

select tests.act_as_dba();
select lives_ok($$delete from auth.scopes where tenant_id = tests.tenant('t-siu-a') and name = 'team'$$,
                'once its rows are gone the scope can be deleted');
select lives_ok($$delete from auth.tenants where org_id = 't-siu-a'$$,
                'deleting a tenant still takes its scopes and the rows shared into them');
reset role;
select is((select count(*)::int from auth.scopes where tenant_id = (select id from siu_tenant))
          + (select count(*)::int from sources.documents where tenant_id = (select id from siu_tenant)), 0,
          'the tenant''s scopes and documents went with it');

-- Every table the check reads: chained, with a scopes column, readable by the verifier.
select is_empty($$select c.t::text from provenance.chained_tables() as c(t)
                   where exists (select 1 from pg_attribute a where a.attrelid = c.t and a.attname = 'scopes'
                                   and not a.attisdropped)
                     and not has_table_privilege('engram_verifier', c.t, 'select')$$,
                'engram_verifier may read every chained table with a scopes column');

select * from finish();
rollback;
