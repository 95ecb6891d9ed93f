-- Derived-memory tables under forced RLS: for every scoped table an allow and a
-- deny per command and identity; working memory is private to its user; only
-- observations at or above 0.65 are recallable; the usage ledger is per user.
begin;
\ir helpers_knowledge.sql
select plan(65);

select tests.make_tenant('t-m-a', array['team', 'private']);
select tests.make_tenant('t-m-b', array['team']);

create function pg_temp.ins(p_table text, p_org text, p_scope text) returns void language plpgsql as $$
declare
    s uuid[] := tests.scopes(p_org, array[p_scope]);
begin
    execute case p_table
        when 'working_memory' then format('insert into memory.working_memory (session_id, text, scopes) values (''s1'', ''remember'', %L)', s)
        when 'profiles' then format('insert into memory.profiles (subject_user_id, summary, scopes) values (''alice'', ''likes tea'', %L)', s)
        when 'episodes' then format('insert into memory.episodes (session_id, summary, started_at, ended_at, scopes) values (''s1'', ''we talked'', now() - interval ''1 hour'', now(), %L)', s)
        when 'observations' then format('insert into memory.observations (text, confidence, scopes) values (''seen'', 0.9, %L)', s)
        when 'decisions' then format('insert into memory.decisions (category, scenario, reasoning, confidence, scopes) values (''arch'', ''db choice'', ''it owns the data'', 0.8, %L)', s)
        when 'communities' then format('insert into memory.communities (level, member_entity_ids, summary, scopes) values (0, array[uuidv7()], ''cluster'', %L)', s)
        when 'raptor_nodes' then format('insert into memory.raptor_nodes (level, summary, scopes) values (0, ''root'', %L)', s)
    end;
end $$;

create function pg_temp.table_checks(p_table text) returns setof text language plpgsql as $$
begin
    perform tests.act_as('t-m-a', 'alice', array['private'], array['team']);
    return next lives_ok(format($q$select pg_temp.ins(%L, 't-m-a', 'team')$q$, p_table),
                         p_table || ': insert allow with write on the scope');
    return next throws_ok(format($q$select pg_temp.ins(%L, 't-m-a', 'private')$q$, p_table), '42501', null,
                          p_table || ': insert deny for a read-only scope');
    perform set_config('role', 'none', true);
    perform tests.act_as('t-m-a', 'alice', array['team'], '{}');
    return next is((select count(*)::int from pg_temp.rows(p_table)), 1, p_table || ': select allow with read');
    return next is(pg_temp.updated(p_table), 0, p_table || ': update deny for a read-only scope');
    perform set_config('role', 'none', true);
    perform tests.act_as('t-m-a', 'alice', array['private'], '{}');
    return next is((select count(*)::int from pg_temp.rows(p_table)), 0, p_table || ': select deny in another scope');
    perform set_config('role', 'none', true);
    perform tests.act_as('t-m-b', 'alice', array['team'], array['team']);
    return next is((select count(*)::int from pg_temp.rows(p_table)), 0, p_table || ': select deny in another tenant');
    perform set_config('role', 'none', true);
    perform tests.act_as_nobody();
    return next is((select count(*)::int from pg_temp.rows(p_table)), 0, p_table || ': no identity sees nothing');
    perform set_config('role', 'none', true);
end $$;

create function pg_temp.rows(p_table text) returns setof uuid language plpgsql as $$
begin
    return query execute format('select id from memory.%I', p_table);
end $$;
create function pg_temp.updated(p_table text) returns integer language plpgsql as $$
declare
    n integer;
begin
    execute format('update memory.%I set scopes = scopes', p_table);
    get diagnostics n = row_count;
    return n;
end $$;

select * from pg_temp.table_checks('working_memory');
select * from pg_temp.table_checks('profiles');
select * from pg_temp.table_checks('episodes');
select * from pg_temp.table_checks('observations');
select * from pg_temp.table_checks('decisions');
select * from pg_temp.table_checks('communities');
select * from pg_temp.table_checks('raptor_nodes');
reset role;

-- working memory belongs to its user
select tests.act_as('t-m-a', 'bob', array['team'], array['team']);
select is_empty('select 1 from memory.working_memory', 'working memory: another user of the scope sees none of it');
select lives_ok($$insert into memory.working_memory (session_id, text, scopes)
                  values ('s2', 'bob''s', tests.scopes('t-m-a', array['team']))$$, 'working memory: bob writes his own');
select is((select user_id from memory.working_memory), 'bob', 'working memory: the user comes from the identity');
reset role;

-- observations: confidence gate
select tests.act_as('t-m-a', 'alice', '{}', array['team']);
insert into memory.observations (text, confidence, scopes)
values ('weak', 0.64, tests.scopes('t-m-a', array['team'])), ('strong', 0.65, tests.scopes('t-m-a', array['team']));
select results_eq($$select text from memory.recallable_observations order by text$$,
                  $$values ('seen'), ('strong')$$, 'only observations with confidence >= 0.65 are recallable');
select throws_ok($$insert into memory.observations (text, confidence, scopes)
                   values ('bad', 1.2, tests.scopes('t-m-a', array['team']))$$, '23514', null,
                 'observation confidence outside [0, 1] is refused');
-- decisions and causal links
select lives_ok($$with b as (insert into memory.decisions (category, scenario, reasoning, confidence, scopes)
                                values ('arch', 'later', 'same as before', 0.7, tests.scopes('t-m-a', array['team']))
                                returning id)
                  insert into memory.decision_links (from_decision_id, to_decision_id, kind, scopes)
                  select a.id, b.id, 'precedent_for', tests.scopes('t-m-a', array['team'])
                    from (select id from memory.decisions order by created_at limit 1) a, b$$,
                'a causal link between two decisions');
select is((select kind::text from memory.decision_links), 'precedent_for', 'the link keeps its kind');
select throws_ok($$insert into memory.episodes (session_id, summary, started_at, ended_at, scopes)
                   values ('s', 'x', now(), now() - interval '1 day', tests.scopes('t-m-a', array['team']))$$,
                 '23514', null, 'an episode that ends before it starts is refused');
reset role;

-- usage ledger and its daily aggregate
select tests.act_as('t-m-a', 'alice', array['team'], '{}');
insert into memory.usage_ledger (operation, channel) values ('recall', 'mcp'), ('recall', 'mcp');
reset role;
select tests.act_as('t-m-a', 'bob', array['team'], '{}');
insert into memory.usage_ledger (operation, channel) values ('recall', 'mcp');
select is((select count(*)::int from memory.usage_ledger), 1, 'usage ledger: a user reads only their own rows');
select throws_ok($$insert into memory.usage_ledger (operation, channel, user_id) values ('recall', 'mcp', 'alice')$$,
                 '42501', null, 'usage ledger: cannot write rows for another user');
select is(memory.aggregate_usage(current_date), 1, 'aggregate: one row per operation and channel');
select results_eq($$select operations, users from memory.usage_daily$$, $$values (3::bigint, 2)$$,
                  'aggregate counts the whole tenant''s ledger');
select is(memory.aggregate_usage(current_date), 1, 'aggregate is idempotent');
select is((select operations from memory.usage_daily), 3::bigint, 'a second aggregate does not double count');
reset role;
select tests.act_as('t-m-b', 'carol', array['team'], '{}');
select is_empty('select 1 from memory.usage_daily', 'usage_daily: another tenant sees nothing');
select is_empty('select 1 from memory.usage_ledger', 'usage_ledger: another tenant sees nothing');
reset role;

select * from finish();
rollback;
