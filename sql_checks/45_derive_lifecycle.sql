-- Lifecycle policies and document use under forced RLS: allow and deny per
-- policy; document_use is written only through the ledger trigger and read
-- only alongside a document the caller can read.
begin;
select plan(17);

select tests.make_tenant('t-lc-a', array['team', 'exec']) is not null as made;
select tests.make_tenant('t-lc-b', array['team']) is not null as made;
create temp table ids as select tests.make_document('t-lc-a', 'team.md', array['team']) as team_doc,
                                tests.make_document('t-lc-a', 'exec.md', array['exec']) as exec_doc;
grant select on ids to public;

-- lifecycle_policies
select tests.act_as('t-lc-a', 'alice', '{}', array['team']);
select lives_ok($$insert into memory.lifecycle_policies (collection, archive_after_days) values ('notes', 30)$$,
                'lifecycle_policies: insert allow in the bound tenant');
select throws_ok($$insert into memory.lifecycle_policies (tenant_id, collection, archive_after_days)
                   values (tests.tenant('t-lc-b'), 'notes', 30)$$, '42501', null,
                 'lifecycle_policies: insert deny for tenant_id (no column grant)');
select throws_ok($$insert into memory.lifecycle_policies (collection, archive_after_days) values ('x', 0)$$,
                 '23514', null, 'lifecycle_policies: days must be positive');
select is((select updated_by from memory.lifecycle_policies), 'alice', 'lifecycle_policies: author stamped');
select lives_ok($$update memory.lifecycle_policies set archive_after_days = 10$$,
                'lifecycle_policies: update allow of archive_after_days');
select throws_ok($$update memory.lifecycle_policies set collection = 'other'$$, '42501', null,
                 'lifecycle_policies: update deny of collection (no column grant)');
reset role;
select tests.act_as('t-lc-b', 'alice', array['team'], array['team']);
select is_empty('select 1 from memory.lifecycle_policies', 'lifecycle_policies: select deny in another tenant');
select lives_ok('delete from memory.lifecycle_policies',
                'lifecycle_policies: a delete from another tenant runs (and removes nothing, below)');
reset role;
select tests.act_as_nobody();
select is_empty('select 1 from memory.lifecycle_policies', 'lifecycle_policies: no identity sees nothing');
reset role;
select tests.act_as('t-lc-a', 'bob', array['team'], '{}');
select is((select archive_after_days from memory.lifecycle_policies), 10,
          'lifecycle_policies: select allow for any user of the tenant; the other tenant''s delete was denied');
reset role;

-- document_use
select tests.act_as('t-lc-a', 'alice', array['team', 'exec'], '{}');
select throws_ok($$insert into memory.document_use (tenant_id, document_id, last_used_at)
                   values (tests.tenant('t-lc-a'), (select team_doc from ids), now())$$, '42501', null,
                 'document_use: direct insert deny (written only by the ledger trigger)');
select lives_ok($$insert into memory.usage_ledger (operation, channel, item_table, item_id)
                  values ('mark_used', 'python', 'sources.documents', (select team_doc from ids)),
                         ('mark_used', 'python', 'sources.documents', (select team_doc from ids)),
                         ('mark_used', 'python', 'sources.documents', (select exec_doc from ids))$$,
                'document_use: a ledger row about a document is allowed');
select is((select uses from memory.document_use where document_id = (select team_doc from ids)), 2::bigint,
          'document_use: the trigger counts each use');
select throws_ok($$update memory.document_use set uses = 0$$, '42501', null,
                 'document_use: update deny for the app');
reset role;
select tests.act_as('t-lc-a', 'bob', array['team'], '{}');
select is((select array_agg(document_id) from memory.document_use), array[(select team_doc from ids)],
          'document_use: select allow only beside a readable document');
reset role;
select tests.act_as('t-lc-b', 'alice', array['team'], '{}');
select is_empty('select 1 from memory.document_use', 'document_use: select deny in another tenant');
reset role;
select tests.act_as_nobody();
select is_empty('select 1 from memory.document_use', 'document_use: no identity sees nothing');
reset role;

select * from finish();
rollback;
