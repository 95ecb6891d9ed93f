-- Policy cases, engram_app: an allow and a deny for every policy of the application role,
-- each tagged [policy <name> allow|deny] for the coverage check (65_policy_coverage.sql).
-- Scoped tables get the four commands from one driver (pg_temp.scoped): insert by a writer
-- of the scope (allow) and by a reader only (deny); select by a reader of the scope (allow)
-- and of another scope (deny); update and delete by a writer (allow: one row) and by a
-- reader only (deny: no row). Tenant-wide tables follow, case by case.
begin;
\ir helpers_knowledge.sql
select plan(142);

select tests.make_tenant('t-pa-a', array['team', 'hr']) is not null as made;
select tests.make_tenant('t-pa-b', array['team']) is not null as made;
create temp table fx (name text primary key, id uuid);
grant select, insert on fx to public;
-- Rows the scoped inserts hang from, made as the superuser.
insert into fx values ('doc', tests.make_document('t-pa-a', 'fixture.md', array['team'], 'fixture body'));
insert into fx select 'chunk', id from sources.chunks where document_id = (select id from fx where name = 'doc');
insert into fx values ('ent', tests.k_entity('t-pa-a', 'person', 'Ann Lee', array['team'])),
                      ('ent2', tests.k_entity('t-pa-a', 'person', 'Bo Chen', array['team']));
select tests.act_as('t-pa-a', 'fixture', '{}', array['team']);
insert into fx values ('claim1', tests.k_claim((select id from fx where name = 'ent'), 'role', 'lead',
                                               tests.scopes('t-pa-a', array['team']))),
                      ('claim2', tests.k_claim((select id from fx where name = 'ent'), 'role', 'intern',
                                               tests.scopes('t-pa-a', array['team'])));
with d as (insert into memory.decisions (category, scenario, reasoning, confidence, scopes)
           values ('arch', 'one', 'r', 0.8, tests.scopes('t-pa-a', array['team'])),
                  ('arch', 'two', 'r', 0.8, tests.scopes('t-pa-a', array['team'])) returning id, scenario)
insert into fx select 'decision-' || scenario, id from d;
reset role;

-- The key column of each scoped table (extractions are keyed by their chunk).
create function pg_temp.key(p_table text) returns text language sql as $$
    select case p_table when 'memory.extractions' then 'chunk_id' else 'id' end
$$;

-- One row of each scoped table in scope p_scope, written as the bound identity; its key is
-- kept in fx as 'new <table>'.
create function pg_temp.ins(p_table text, p_scope text) returns void language plpgsql as $$
declare
    s uuid[] := tests.scopes('t-pa-a', array[p_scope]);
    f record;
    stmt text;
    made uuid;
begin
    select (select id from fx where name = 'doc') as doc, (select id from fx where name = 'chunk') as chunk,
           (select id from fx where name = 'ent') as ent, (select id from fx where name = 'claim1') as c1,
           (select id from fx where name = 'claim2') as c2, (select id from fx where name = 'decision-one') as d1,
           (select id from fx where name = 'decision-two') as d2 into f;
    stmt := case p_table
        when 'sources.documents' then format('insert into sources.documents (collection, path, title, body, scopes) values (''pc'', %L, ''t'', ''b'', %L)', gen_random_uuid(), s)
        when 'sources.chunks' then format('insert into sources.chunks (document_id, ordinal, text, char_start, char_end) values (%L, 1 + (random() * 1000000)::int, ''x'', 0, 1)', f.doc)
        when 'knowledge.entities' then format('insert into knowledge.entities (entity_type, canonical_name, scopes) values (''thing'', %L, %L)', 'pc ' || gen_random_uuid(), s)
        when 'knowledge.fact_claim' then format('select tests.k_claim(%L, ''role'', %L, %L)', f.ent, gen_random_uuid(), s)
        when 'knowledge.conflicts' then format('insert into knowledge.conflicts (claim_a, claim_b, kind, predicate, subject_id, perspective_key, scopes) values (%L, %L, ''value'', ''role'', %L, ''world'', %L)', f.c1, f.c2, f.ent, s)
        when 'knowledge.quarantine' then format('insert into knowledge.quarantine (author, payload, reasons, scopes) values (auth.user_id(), ''{}'', array[''a test''], %L)', s)
        when 'memory.working_memory' then format('insert into memory.working_memory (session_id, text, scopes) values (''s1'', ''remember'', %L)', s)
        when 'memory.profiles' then format('insert into memory.profiles (subject_user_id, summary, scopes) values (auth.user_id(), ''likes tea'', %L)', s)
        when 'memory.episodes' then format('insert into memory.episodes (session_id, summary, started_at, ended_at, scopes) values (''s1'', ''we talked'', now() - interval ''1 hour'', now(), %L)', s)
        when 'memory.observations' then format('insert into memory.observations (text, confidence, scopes) values (''seen'', 0.9, %L)', s)
        when 'memory.decisions' then format('insert into memory.decisions (category, scenario, reasoning, confidence, scopes) values (''arch'', ''db'', ''it owns the data'', 0.8, %L)', s)
        when 'memory.decision_links' then format('insert into memory.decision_links (from_decision_id, to_decision_id, kind, scopes) values (%L, %L, ''precedent_for'', %L)', f.d1, f.d2, s)
        when 'memory.communities' then format('insert into memory.communities (level, member_entity_ids, summary, scopes) values (0, array[%L::uuid], ''cluster'', %L)', f.ent, s)
        when 'memory.raptor_nodes' then format('insert into memory.raptor_nodes (level, summary, scopes) values (0, ''root'', %L)', s)
        when 'memory.extractions' then format('insert into memory.extractions (chunk_id, content_hash, scopes, model) values (%L, ''\x01'', %L, ''m'')', f.chunk, s)
    end;
    if stmt like 'insert %' then
        stmt := stmt || ' returning ' || pg_temp.key(p_table);
    end if;
    execute stmt into made;
    insert into fx values ('new ' || p_table, made);
end $$;

-- Rows a statement touched, undone at once (the subtransaction is rolled back).
create function pg_temp.touched(p_sql text) returns integer language plpgsql as $$
declare
    n integer;
begin
    begin
        execute p_sql;
        get diagnostics n = row_count;
        raise exception using errcode = 'P0099', message = n::text;
    exception when sqlstate 'P0099' then
        return sqlerrm::integer;
    end;
end $$;

create function pg_temp.rows(p_table text) returns integer language plpgsql as $$
declare
    n integer;
begin
    execute format('select count(*) from %s', p_table) into n;
    return n;
end $$;

-- The four commands of one scoped table; p_update is a statement that changes nothing a
-- reader would notice on every visible row (its granted columns differ per table).
-- p_deny_read: what the refused writer may read (conflicts' insert check is "reads a scope of
-- the row", so its refused writer reads another scope; elsewhere it reads the row's scope).
create function pg_temp.scoped(p_table text, p_update text, p_deny_read text[] default array['team'])
    returns setof text language plpgsql as $$
declare
    name text := split_part(p_table, '.', 2);
    has_update boolean := exists (select 1 from pg_policies where policyname = name || '__update_app');
    has_delete boolean := exists (select 1 from pg_policies where policyname = name || '__delete_app');
    new_key uuid;
begin
    perform tests.act_as('t-pa-a', 'alice', '{}', array['team']);
    return next lives_ok(format('select pg_temp.ins(%L, ''team'')', p_table),
                         format('%s: insert by a writer of the scope [policy %s__insert_app allow]', p_table, name));
    perform set_config('role', 'none', true);
    perform tests.act_as('t-pa-a', 'alice', p_deny_read, array['hr']);
    return next throws_ok(format('select pg_temp.ins(%L, ''team'')', p_table), '42501', null,
                          format('%s: insert into a scope one does not write [policy %s__insert_app deny]',
                                 p_table, name));
    perform set_config('role', 'none', true);
    perform tests.act_as('t-pa-a', 'alice', array['team'], array['hr']);
    return next ok(pg_temp.rows(p_table) >= 1,
                   format('%s: select by a reader of the scope [policy %s__select_app allow]', p_table, name));
    if has_update then
        return next is(pg_temp.touched(format('update %s set %s', p_table, p_update)), 0,
                       format('%s: update by a reader only changes nothing [policy %s__update_app deny]', p_table, name));
    end if;
    if has_delete then
        return next is(pg_temp.touched(format('delete from %s', p_table)), 0,
                       format('%s: delete by a reader only removes nothing [policy %s__delete_app deny]', p_table, name));
    end if;
    perform set_config('role', 'none', true);
    perform tests.act_as('t-pa-a', 'carol', array['hr'], '{}');
    return next is(pg_temp.rows(p_table), 0,
                   format('%s: select by a reader of another scope [policy %s__select_app deny]', p_table, name));
    perform set_config('role', 'none', true);
    perform tests.act_as('t-pa-b', 'carol', array['team'], array['team']);
    return next is(pg_temp.rows(p_table), 0, format('%s: another tenant sees nothing', p_table));
    perform set_config('role', 'none', true);
    perform tests.act_as('t-pa-a', 'alice', array['team'], array['team']);
    new_key := (select id from fx where fx.name = 'new ' || p_table);
    if has_update then
        return next is(pg_temp.touched(format('update %s set %s where %s = %L', p_table, p_update,
                                              pg_temp.key(p_table), new_key)), 1,
                       format('%s: update by a writer [policy %s__update_app allow]', p_table, name));
    end if;
    if has_delete then
        return next is(pg_temp.touched(format('delete from %s where %s = %L', p_table, pg_temp.key(p_table),
                                              new_key)), 1,
                       format('%s: delete by a writer [policy %s__delete_app allow]', p_table, name));
    end if;
    perform set_config('role', 'none', true);
end $$;

select * from pg_temp.scoped('sources.documents', 'title = title');
select * from pg_temp.scoped('sources.chunks', 'embed_error = embed_error');
select * from pg_temp.scoped('knowledge.entities', 'summary = summary');
select * from pg_temp.scoped('knowledge.fact_claim', 'disputed = disputed');
select * from pg_temp.scoped('knowledge.conflicts', 'status = status', array['hr']);
select * from pg_temp.scoped('knowledge.quarantine', 'reasons = reasons');
select * from pg_temp.scoped('memory.working_memory', 'text = text');
select * from pg_temp.scoped('memory.profiles', 'summary = summary');
select * from pg_temp.scoped('memory.episodes', 'summary = summary');
select * from pg_temp.scoped('memory.observations', 'scopes = scopes');
select * from pg_temp.scoped('memory.decisions', 'confidence = confidence');
select * from pg_temp.scoped('memory.decision_links', 'kind = kind');
select * from pg_temp.scoped('memory.communities', 'scopes = scopes');
select * from pg_temp.scoped('memory.raptor_nodes', 'scopes = scopes');
select * from pg_temp.scoped('memory.extractions', 'model = model');
reset role;

-- working memory: the service reads every user's items; an ordinary user of the scope does not.
select tests.act_as('t-pa-a', 'bob', array['team'], array['team']);
select is(pg_temp.rows('memory.working_memory'), 0,
          'working_memory: another user of the scope sees none of alice''s items [policy working_memory__select_service deny]');
reset role;
select set_config('role', 'engram_app', true);
select auth.bind_service_identity('t-pa-a', array['team', 'hr']) is not null as bound;
select ok(pg_temp.rows('memory.working_memory') >= 1,
          'working_memory: the derive service reads every user''s items [policy working_memory__select_service allow]');
reset role;

-- Tenant-wide tables: the bound tenant, never another.
select tests.act_as('t-pa-a', 'alice', '{}', array['team']);
select lives_ok($$insert into memory.lifecycle_policies (collection, archive_after_days) values ('pc', 30)$$,
                'lifecycle_policies: insert in the bound tenant [policy lifecycle_policies__insert_app allow]');
select lives_ok($$insert into memory.usage_ledger (operation, channel) values ('recall', 'python')$$,
                'usage_ledger: the bound user''s own row [policy usage_ledger__insert_app allow]');
select throws_ok($$insert into memory.usage_ledger (operation, channel, user_id) values ('recall', 'python', 'bob')$$,
                 '42501', null, 'usage_ledger: a row for another user is refused [policy usage_ledger__insert_app deny]');
reset role;

select tests.act_as('t-pa-a', 'bob', array['team'], array['team']);
select is(pg_temp.rows('memory.usage_ledger'), 0,
          'usage_ledger: another user of the tenant sees none of alice''s rows [policy usage_ledger__select_app deny]');
reset role;
select tests.act_as('t-pa-a', 'alice', array['team'], '{}');
select ok(pg_temp.rows('memory.usage_ledger') >= 1,
          'usage_ledger: the user reads their own rows [policy usage_ledger__select_app allow]');
reset role;

-- the other tenant's writes reach nothing of this one
select tests.act_as('t-pa-b', 'alice', array['team'], array['team']);
select is(pg_temp.touched($$update memory.lifecycle_policies set archive_after_days = 5$$), 0,
          'lifecycle_policies: another tenant updates nothing [policy lifecycle_policies__update_app deny]');
select is(pg_temp.touched($$delete from memory.lifecycle_policies$$), 0,
          'lifecycle_policies: another tenant deletes nothing [policy lifecycle_policies__delete_app deny]');
select throws_ok($$insert into memory.lifecycle_policies (tenant_id, collection, archive_after_days)
                   values (tests.tenant('t-pa-a'), 'pc2', 30)$$, '42501', null,
                 'lifecycle_policies: no insert into another tenant [policy lifecycle_policies__insert_app deny]');
reset role;
select tests.act_as_nobody();
select throws_ok($$select provenance.begin_activity('tests.policy', '{}')$$, '28000', null,
                 'activities: no identity, no activity [policy activities__insert_app deny]');
reset role;
select tests.act_as('t-pa-a', 'alice', '{}', array['team']);
select is(pg_temp.touched($$update memory.lifecycle_policies set archive_after_days = 7$$), 1,
          'lifecycle_policies: update in the bound tenant [policy lifecycle_policies__update_app allow]');
select is(pg_temp.touched($$delete from memory.lifecycle_policies$$), 1,
          'lifecycle_policies: delete in the bound tenant [policy lifecycle_policies__delete_app allow]');
reset role;

select * from finish();
rollback;
