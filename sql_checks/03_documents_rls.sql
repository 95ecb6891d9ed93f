-- Documents under forced RLS: allow and deny for each policy and command.
-- Read: the caller holds read or write on at least one of the row's scopes.
-- Write: the caller holds write on every one of the row's scopes.
begin;
select plan(24);

select tests.make_tenant('t-doc-a', array['team', 'private', 'exec']);
select tests.make_tenant('t-doc-b', array['team']);
select tests.make_document('t-doc-a', 'team.md', array['team']);
select tests.make_document('t-doc-a', 'private.md', array['private']);
select tests.make_document('t-doc-a', 'shared.md', array['team', 'exec']);
select tests.make_document('t-doc-b', 'other-tenant.md', array['team']);

-- select
select tests.act_as('t-doc-a', 'alice', array['team'], '{}');
select results_eq('select path from sources.documents order by path', $$values ('shared.md'), ('team.md')$$,
                  'select allow: read on one of the row''s scopes is enough');
select is_empty($$select 1 from sources.documents where path = 'private.md'$$,
                'select deny: a document in another scope is invisible');
select is_empty($$select 1 from sources.documents where path = 'other-tenant.md'$$,
                'select deny: a document of another tenant is invisible');
select is_empty($$select 1 from sources.current_documents where path = 'other-tenant.md'$$,
                'the security_barrier view cannot widen what the caller sees');
select is((select count(*)::int from sources.current_documents), 2, 'the view shows exactly the visible documents');
reset role;

select tests.act_as_nobody();
select is_empty('select 1 from sources.documents', 'no identity bound: sees nothing');
select is_empty('select 1 from sources.current_documents', 'no identity bound: the view shows nothing');
select throws_ok($$insert into sources.documents (collection, path, title, body, scopes)
                   values ('notes', 'x.md', 'x', 'x', array[tests.scope('t-doc-a', 'team')])$$,
                 null, null, 'no identity bound: cannot insert');
reset role;

-- row_security cannot be turned off by the app role
select tests.act_as('t-doc-a', 'alice', array['team'], '{}');
set local row_security = off;
select throws_ok('select count(*) from sources.documents', '42501', null,
                 'engram_app with row_security = off gets an error, never a bypass');
reset row_security;
reset role;

-- insert
select tests.act_as('t-doc-a', 'alice', array['private'], array['team']);
select lives_ok($$insert into sources.documents (collection, path, title, body, scopes)
                  values ('notes', 'new.md', 'New', 'fresh', array[tests.scope('t-doc-a', 'team')])$$,
                'insert allow: write on the row''s only scope');
select is((select tenant_id from sources.documents where path = 'new.md'), tests.tenant('t-doc-a'),
          'insert: the tenant comes from the bound identity');
select throws_ok($$insert into sources.documents (collection, path, title, body, scopes)
                   values ('notes', 'ro.md', 'RO', 'x', array[tests.scope('t-doc-a', 'private')])$$,
                 '42501', null, 'insert deny: read-only scope attempting a write');
select throws_ok($$insert into sources.documents (collection, path, title, body, scopes)
                   values ('notes', 'mixed.md', 'M', 'x',
                           array[tests.scope('t-doc-a', 'team'), tests.scope('t-doc-a', 'exec')])$$,
                 '42501', null, 'insert deny: write on only some of the row''s scopes');
select throws_ok($$insert into sources.documents (tenant_id, collection, path, title, body, scopes)
                   values (tests.tenant('t-doc-b'), 'notes', 'x.md', 'x', 'x', array[tests.scope('t-doc-b', 'team')])$$,
                 '42501', null, 'insert deny: the app cannot choose the tenant column');
reset role;

-- update
select tests.act_as('t-doc-a', 'alice', array['private'], array['team']);
select results_eq($$update sources.documents set title = 'Team!' where path = 'team.md' returning title$$,
                  $$values ('Team!')$$, 'update allow: write on every scope of the row');
select is_empty($$update sources.documents set title = 'x' where path = 'shared.md' returning 1$$,
                'update deny: write on only some scopes changes nothing');
select is_empty($$update sources.documents set title = 'x' where path = 'private.md' returning 1$$,
                'update deny: read-only scope changes nothing');
select throws_ok($$update sources.documents set scopes = array[tests.scope('t-doc-a', 'exec')] where path = 'team.md'$$,
                 '42501', null, 'update deny: moving a row into a scope without write');
reset role;

-- delete
select tests.act_as('t-doc-a', 'alice', array['team'], array['private']);
select is_empty($$delete from sources.documents where path = 'team.md' returning 1$$,
                'delete deny: read-only on the row''s scope');
select results_eq($$delete from sources.documents where path = 'private.md' returning path$$,
                  $$values ('private.md')$$, 'delete allow: write on the row''s scope');
reset role;

select tests.act_as('t-doc-b', 'bob', array['team'], array['team']);
select is_empty($$delete from sources.documents where tenant_id = tests.tenant('t-doc-a') returning 1$$,
                'delete deny: another tenant''s rows are untouchable');
select is_empty($$update sources.documents set title = 'pwned' where tenant_id = tests.tenant('t-doc-a') returning 1$$,
                'update deny: another tenant''s rows are untouchable');
reset role;
select is((select count(*)::int from sources.documents where title = 'pwned' and tenant_id = tests.tenant('t-doc-a')), 0,
          'nothing was changed across tenants');
select is((select count(*)::int from sources.documents where tenant_id = tests.tenant('t-doc-a')), 3,
          'tenant A still has its three documents');

select * from finish();
rollback;
