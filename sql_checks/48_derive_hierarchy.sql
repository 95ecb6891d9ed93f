-- Derived memory, second pass (0017): value_daily under forced RLS (a row is visible only
-- beside its item; written only by memory.refresh_value, changes only); community parents
-- stay in their tenant; a user profile lives in its user's partition and a profile is one
-- per subject, partition and scope set.
begin;
\ir helpers_knowledge.sql
select plan(25);

select tests.make_tenant('t-vd-a', array['team', 'exec']) is not null as made;
select tests.make_tenant('t-vd-b', array['team']) is not null as made;
create temp table ids as select tests.make_document('t-vd-a', 'team.md', array['team']) as team_doc,
                                tests.make_document('t-vd-a', 'exec.md', array['exec']) as exec_doc,
                                tests.make_document('t-vd-b', 'other.md', array['team']) as other_doc;
grant select on ids to public;
create temp table comm (parent uuid);
grant all on comm to public;

-- value_daily: fed from the ledger by refresh_value, never written by the app
select tests.act_as('t-vd-a', 'alice', array['team', 'exec'], '{}');
insert into memory.usage_ledger (operation, channel, item_table, item_id)
values ('mark_used', 'cli', 'sources.documents', (select team_doc from ids)),
       ('recall', 'mcp', 'sources.documents', (select team_doc from ids)),
       ('mark_used', 'cli', 'sources.documents', (select exec_doc from ids)),
       ('mark_used', 'cli', 'memory.nowhere', uuidv7()),
       ('recall', 'mcp', null, null);
reset role;
select tests.act_as('t-vd-a', 'bob', array['team'], '{}');
insert into memory.usage_ledger (operation, channel, item_table, item_id)
values ('mark_used', 'python', 'sources.documents', (select team_doc from ids));
select throws_ok($$insert into memory.value_daily (tenant_id, day, item_table, item_id, uses, marks, users)
                   values (tests.tenant('t-vd-a'), current_date, 'sources.documents',
                           (select team_doc from ids), 1, 1, 1)$$, '42501', null,
                 'value_daily: direct insert deny for the app (only refresh_value writes)');
select is(memory.refresh_value(current_date), 3, 'refresh_value: one row per item named that day');
select is(memory.refresh_value(current_date), 0, 'refresh_value: a second run writes nothing');
select results_eq($$select uses, marks, users from memory.value_daily$$, $$values (3::bigint, 2::bigint, 2)$$,
                  'value_daily: bob sees only the team document''s row, counted over every user''s ledger');
select throws_ok($$update memory.value_daily set uses = 0$$, '42501', null,
                 'value_daily: update deny for the app');
select throws_ok($$delete from memory.value_daily$$, '42501', null, 'value_daily: delete deny for the app');
reset role;
select tests.act_as('t-vd-a', 'alice', array['team', 'exec'], '{}');
select is((select count(*)::int from memory.value_daily), 2,
          'value_daily: select allow for both documents alice can read (never the unknown table)');
reset role;
select tests.act_as('t-vd-a', 'carol', array['exec'], '{}');
select is((select array_agg(item_id) from memory.value_daily), array[(select exec_doc from ids)],
          'value_daily: select deny for an item the reader cannot see');
reset role;
select tests.act_as('t-vd-a', 'bob', array['team'], '{}');
insert into memory.usage_ledger (operation, channel, item_table, item_id)
values ('mark_used', 'python', 'sources.documents', (select team_doc from ids));
select is(memory.refresh_value(current_date), 1, 'refresh_value: only the row whose counts changed');
select is((select marks from memory.value_daily), 3::bigint, 'refresh_value: the new mark is counted');
reset role;
select tests.act_as('t-vd-b', 'alice', array['team'], '{}');
select is_empty('select 1 from memory.value_daily', 'value_daily: select deny in another tenant');
select is(memory.refresh_value(current_date), 0, 'refresh_value: another tenant''s ledger is not counted');
reset role;
select tests.act_as_nobody();
select is_empty('select 1 from memory.value_daily', 'value_daily: no identity sees nothing');
select throws_ok('select memory.refresh_value(current_date)', '28000', null,
                 'refresh_value: refused without an identity');
reset role;
select tests.act_as('t-vd-a', 'alice', array['team'], '{}');
select throws_ok('select memory.refresh_value(null)', '22023', null, 'refresh_value: a day is needed');
select ok(memory.item_visible('sources.documents', (select team_doc from ids)),
          'item_visible: a readable document');
select ok(not memory.item_visible('sources.documents', (select exec_doc from ids)),
          'item_visible: a document in a scope alice does not read');
select ok(not memory.item_visible('sources.documents', (select other_doc from ids)),
          'item_visible: another tenant''s document');
select ok(not memory.item_visible('auth.tenants', tests.tenant('t-vd-a')), 'item_visible: an unknown table');
reset role;

-- communities: a parent in the same tenant, never the community itself
select tests.act_as('t-vd-a', 'alice', array['team'], array['team']);
with made as (insert into memory.communities (level, member_entity_ids, summary, scopes)
              values (1, array[uuidv7(), uuidv7()], 'pair', tests.scopes('t-vd-a', array['team']))
              returning id)
insert into comm select id from made;
select lives_ok($$insert into memory.communities (level, member_entity_ids, summary, scopes, parent_id)
                  values (0, array[uuidv7()], 'cell', tests.scopes('t-vd-a', array['team']), (select parent from comm))$$,
                'communities: insert allow with a parent of the same tenant');
select throws_ok($$update memory.communities set parent_id = id$$, '23514', null,
                 'communities: a community is not its own parent');
reset role;
select tests.act_as('t-vd-b', 'alice', array['team'], array['team']);
select throws_ok($$insert into memory.communities (level, member_entity_ids, summary, scopes, parent_id)
                   values (0, array[uuidv7()], 'cell', tests.scopes('t-vd-b', array['team']), (select parent from comm))$$,
                 '23503', null, 'communities: insert deny with a parent of another tenant');
reset role;

-- profiles: a user's own profile lives in that user's partition; one per subject, partition and scope set
select tests.act_as('t-vd-a', 'alice', array['team'], array['team']);
insert into memory.profiles (subject_user_id, perspective_key, summary, scopes)
values ('bob', 'world', 'bob likes tea', tests.scopes('t-vd-a', array['team']));
select is((select perspective_key from memory.profiles where subject_user_id = 'bob'), 'user:bob',
          'profiles: a user profile is put in its user''s partition whatever the writer said');
select throws_ok($$insert into memory.profiles (subject_user_id, summary, scopes)
                   values ('bob', 'bob likes coffee', tests.scopes('t-vd-a', array['team']))$$, '23505', null,
                 'profiles: a second profile of the same user and scope set is refused');
select throws_ok($$insert into memory.profiles (subject_user_id, summary, scopes, input_digest)
                   values ('carol', 'carol', tests.scopes('t-vd-a', array['team']), '\x00'::bytea)$$, '23514', null,
                 'profiles: an input digest is a SHA-256 (32 bytes)');
reset role;

select * from finish();
rollback;
