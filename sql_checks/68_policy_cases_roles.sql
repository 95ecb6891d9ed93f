-- Policy cases, every role but the application's own scoped writes (67): the verifier,
-- the worker, the owner (through its SECURITY DEFINER functions), the auditor, the DBA,
-- and the application's tenant-wide reads. Each case is tagged [policy <name> allow|deny]
-- for the coverage check (65_policy_coverage.sql). A fixture tenant gets a row in every
-- table first; policies of one shape are then checked by one driver each.
begin;
\ir helpers_knowledge.sql

-- The policies the two looping drivers below (role_reads, worker_updates) check, two cases
-- each: a role's "using (true)" reads, and the worker's updates. The plan counts them from
-- the catalog, so a new table with such a policy adds its two cases without a plan edit;
-- the other 100 cases are written out one by one below.
create function pg_temp.role_read_policies(p_suffix text) returns table (t text, policyname name)
    language sql stable as $$
    select schemaname || '.' || tablename, policyname from pg_policies
     where policyname like '%\_\_' || p_suffix and cmd = 'SELECT' and qual = 'true'
       and schemaname <> 'worker' order by 1
$$;
create function pg_temp.worker_update_policies() returns table (t text, policyname name)
    language sql stable as $$
    select schemaname || '.' || tablename, policyname from pg_policies
     where policyname like '%\_\_update\_worker' and schemaname <> 'worker' order by 1
$$;
select plan(100 + 2 * ((select count(*)::int from pg_temp.role_read_policies('select_verifier'))
                       + (select count(*)::int from pg_temp.role_read_policies('select_worker'))
                       + (select count(*)::int from pg_temp.role_read_policies('select_auditor'))
                       + (select count(*)::int from pg_temp.worker_update_policies())));

select tests.make_tenant('t-pr-a', array['team']) is not null as made;
select tests.make_tenant('t-pr-b', array['team']) is not null as made;
select set_config('tests.tenant_a', tests.tenant('t-pr-a')::text, true) is not null as a,
       set_config('tests.tenant_b', tests.tenant('t-pr-b')::text, true) is not null as b;
-- The two tenants' ids for roles that cannot read auth.tenants.
create function pg_temp.a() returns uuid language sql as $$ select current_setting('tests.tenant_a')::uuid $$;
create function pg_temp.b() returns uuid language sql as $$ select current_setting('tests.tenant_b')::uuid $$;
create temp table fx (name text primary key, id uuid);
grant select, insert on fx to public;
insert into fx values ('doc', tests.make_document('t-pr-a', 'fixture.md', array['team'], 'fixture words')),
                      ('ent', tests.k_entity('t-pr-a', 'person', 'Ann Lee', array['team']));
select tests.act_as_dba();
insert into knowledge.shapes (tenant_id, predicate, max_count) values (tests.tenant('t-pr-a'), 'role', 5);
insert into knowledge.tenant_settings (tenant_id, strict_shapes) values (tests.tenant('t-pr-a'), false);
reset role;

-- The fixture tenant's rows, written the way Engram writes them, chained at each statement.
set constraints all immediate;
select tests.act_as('t-pr-a', 'alice', '{}', array['team']);
select provenance.begin_activity('tests.fixture', '{}') is not null as begun;
insert into provenance.agents (kind, name, version) values ('software', 'fixture', '1');
insert into fx values ('c1', tests.k_claim((select id from fx where name = 'ent'), 'role', 'lead',
                                           tests.scopes('t-pr-a', array['team']))),
                      ('c2', tests.k_claim((select id from fx where name = 'ent'), 'role', 'intern',
                                           tests.scopes('t-pr-a', array['team'])));
insert into knowledge.conflicts (claim_a, claim_b, kind, predicate, subject_id, perspective_key, scopes)
select (select id from fx where name = 'c1'), (select id from fx where name = 'c2'), 'value', 'role',
       (select id from fx where name = 'ent'), 'world', tests.scopes('t-pr-a', array['team']);
insert into knowledge.quarantine (author, payload, reasons, scopes)
values ('alice', '{}', array['fixture'], tests.scopes('t-pr-a', array['team']));
insert into memory.working_memory (session_id, text, scopes) values ('s1', 'remember', tests.scopes('t-pr-a', array['team']));
insert into memory.profiles (subject_user_id, summary, scopes) values ('alice', 'likes tea', tests.scopes('t-pr-a', array['team']));
insert into memory.episodes (session_id, summary, started_at, ended_at, scopes)
values ('s1', 'we talked', now() - interval '1 hour', now(), tests.scopes('t-pr-a', array['team']));
insert into memory.observations (text, confidence, scopes) values ('seen', 0.9, tests.scopes('t-pr-a', array['team']));
with d as (insert into memory.decisions (category, scenario, reasoning, confidence, scopes)
           values ('arch', 'one', 'r', 0.8, tests.scopes('t-pr-a', array['team'])),
                  ('arch', 'two', 'r', 0.8, tests.scopes('t-pr-a', array['team'])) returning id)
insert into memory.decision_links (from_decision_id, to_decision_id, kind, scopes)
select min(id::text)::uuid, max(id::text)::uuid, 'precedent_for', tests.scopes('t-pr-a', array['team']) from d;
insert into memory.communities (level, member_entity_ids, summary, scopes)
values (0, array[(select id from fx where name = 'ent')], 'cluster', tests.scopes('t-pr-a', array['team']));
insert into memory.raptor_nodes (level, summary, scopes) values (0, 'root', tests.scopes('t-pr-a', array['team']));
insert into memory.extractions (chunk_id, content_hash, scopes, model)
select id, '\x01', scopes, 'm' from sources.chunks where document_id = (select id from fx where name = 'doc');
insert into memory.lifecycle_policies (collection, archive_after_days) values ('notes', 30);
insert into memory.usage_ledger (operation, channel, item_table, item_id)
values ('mark_used', 'python', 'sources.documents', (select id from fx where name = 'doc'));
select memory.aggregate_usage(current_date) >= 1 as aggregated;
select memory.refresh_value(current_date) >= 1 as valued;
insert into memory.job_runs (job, ok, line, scopes, started_at)
values ('extract', false, 'failed', tests.scopes('t-pr-a', array['team']), now());
insert into provenance.derivations (derived_table, derived_row_id, source_table, source_row_id)
select 'sources.chunks', jsonb_build_object('id', c.id), 'sources.documents', jsonb_build_object('id', c.document_id)
  from sources.chunks c where c.document_id = (select id from fx where name = 'doc');
insert into provenance.receipts (question_hash, evidence, rendered_hash) values (sha256('q'), '[]', sha256('r'));
select provenance.end_activity();
reset role;
-- A ranking model, written as Engram writes one (the tenant's derive service identity), and a
-- recall's rank event that names it, by alice.
select set_config('role', 'engram_app', true) is not null as app;
select auth.bind_service_identity('t-pr-a', array['team']) is not null as service;
with m as (insert into memory.rank_models (version, artifact, sha256, feature_version, card, events,
                                           training_rows, positives, position_bias, active, activated_at)
           values (1, 'tree', sha256('tree'::bytea), 'f1', '{}', 1, 1, 1, 'none', true, now()) returning id)
insert into fx select 'model', id from m;
reset role;
select tests.act_as('t-pr-a', 'alice', '{}', array['team']);
insert into memory.rank_events (operation, channel, model, model_id, feature_version, question_hash,
                                item_tables, item_ids, document_ids, served_ranks, feature_count, features)
values ('recall', 'python', 'learned', (select id from fx where name = 'model'), 'f1', sha256('q'),
        array['sources.documents'], array[(select id from fx where name = 'doc')],
        array[(select id from fx where name = 'doc')], array[1], 1, array[0.5]::real[]);
reset role;
set local role engram_worker;
insert into worker.embedding_cache (tenant_id, model, content_hash, embedding)
values (pg_temp.a(), 'sentence-transformers/all-MiniLM-L6-v2', '\x02', array_fill(0.1::real, array[384])::vector);
insert into worker.embed_retries (tenant_id, relation, row_key, retry_at, last_error)
values (pg_temp.a(), 'sources.chunks', 'k', now(), 'fixture');
reset role;
-- One write left unchained (deferred): its staged rows are what provenance.pending holds.
set constraints all deferred;
select tests.act_as('t-pr-a', 'alice', '{}', array['team']);
update sources.documents set title = 'pending' where id = (select id from fx where name = 'doc');
reset role;

-- Rows of p_table that p_role sees: of the fixture tenant (by p_tenant_column), or all of
-- them (null); -1 when p_role has no privilege at all. The caller binds what it needs.
create function pg_temp.seen(p_role text, p_table text, p_tenant_column text default 'tenant_id')
    returns integer language plpgsql as $$
declare
    n integer;
begin
    perform set_config('role', p_role, true);
    execute format('select count(*) from %s', p_table)
            || case when p_tenant_column is null then ''
                    else format(' where %I = %L', p_tenant_column, pg_temp.a()) end into n;
    perform set_config('role', 'none', true);
    return n;
exception when insufficient_privilege then
    perform set_config('role', 'none', true);
    return -1;
end $$;

-- Rows a statement touched as p_role, undone at once.
create function pg_temp.touched(p_role text, p_sql text) returns integer language plpgsql as $$
declare
    n integer;
begin
    begin
        perform set_config('role', p_role, true);
        execute p_sql;
        get diagnostics n = row_count;
        raise exception using errcode = 'P0099', message = n::text;
    exception when sqlstate 'P0099' then
        perform set_config('role', 'none', true);
        return sqlerrm::integer;
    end;
end $$;

-- A role's "using (true)" read: it sees the fixture's rows; the application with no identity
-- bound (a role the policy does not name) sees none of them through it.
create function pg_temp.role_reads(p_role text, p_suffix text) returns setof text language plpgsql as $$
declare
    p record;
begin
    for p in select * from pg_temp.role_read_policies(p_suffix) loop
        return next ok(pg_temp.seen(p_role, p.t, case p.t when 'auth.tenants' then 'id' else 'tenant_id' end) >= 1,
                       format('%s: %s reads every tenant''s rows [policy %s allow]', p.t, p_role, p.policyname));
        perform tests.act_as_nobody();
        return next ok(pg_temp.seen('engram_app', p.t, case p.t when 'auth.tenants' then 'id' else 'tenant_id' end) <= 0,
                       format('%s: the application with no identity sees none of them [policy %s deny]',
                              p.t, p.policyname));
        perform set_config('role', 'none', true);
    end loop;
end $$;

select * from pg_temp.role_reads('engram_verifier', 'select_verifier');
select * from pg_temp.role_reads('engram_worker', 'select_worker');
select * from pg_temp.role_reads('engram_auditor', 'select_auditor');

-- The worker's "using (true)" updates: the embedding columns of any tenant's rows (allow),
-- never the tenant or scope columns, which it has no grant on (deny).
create function pg_temp.worker_updates() returns setof text language plpgsql as $$
declare
    p record;
begin
    for p in select * from pg_temp.worker_update_policies() loop
        return next ok(pg_temp.touched('engram_worker', format(
                           'update %s set embed_error = null where tenant_id = %L', p.t, pg_temp.a())) >= 1,
                       format('%s: the worker writes embedding columns [policy %s allow]', p.t, p.policyname));
        return next throws_ok(format('select pg_temp.touched(''engram_worker'', %L)',
                                     format('update %s set tenant_id = tenant_id', p.t)), '42501', null,
                              format('%s: the worker cannot move a row [policy %s deny]', p.t, p.policyname));
    end loop;
end $$;
select * from pg_temp.worker_updates();

-- The application's tenant-wide reads: its bound tenant's rows (allow), none of another's (deny).
create function pg_temp.app_reads(p_table text, p_policy text, p_tenant_column text default 'tenant_id')
    returns setof text language plpgsql as $$
begin
    perform tests.act_as('t-pr-a', 'alice', array['team'], '{}');
    return next ok(pg_temp.seen('engram_app', p_table, p_tenant_column) >= 1,
                   format('%s: read in the bound tenant [policy %s allow]', p_table, p_policy));
    perform set_config('role', 'none', true);
    perform tests.act_as('t-pr-b', 'alice', array['team'], '{}');
    return next is(pg_temp.seen('engram_app', p_table, p_tenant_column), 0,
                   format('%s: nothing of another tenant [policy %s deny]', p_table, p_policy));
    perform set_config('role', 'none', true);
end $$;
select * from pg_temp.app_reads('knowledge.shapes', 'shapes__select_app');
select * from pg_temp.app_reads('knowledge.tenant_settings', 'tenant_settings__select_app');
select * from pg_temp.app_reads('memory.usage_daily', 'usage_daily__select_app');
select * from pg_temp.app_reads('memory.value_daily', 'value_daily__select_app');
select * from pg_temp.app_reads('memory.document_use', 'document_use__select_app');
select * from pg_temp.app_reads('recall.lexical_stats', 'lexical_stats__select_app');
select * from pg_temp.app_reads('provenance.activities', 'activities__select_app');
select * from pg_temp.app_reads('provenance.agents', 'agents__select_app');
select * from pg_temp.app_reads('provenance.derivations', 'derivations__select_app');
select * from pg_temp.app_reads('provenance.receipts', 'receipts__select_app');
select * from pg_temp.app_reads('memory.lifecycle_policies', 'lifecycle_policies__select_app');
select * from pg_temp.app_reads('auth.scopes', 'scopes__select_app');
select * from pg_temp.app_reads('auth.tenants', 'tenants__select_app', 'id');
select * from pg_temp.app_reads('knowledge.fact_content', 'fact_content__select_app');
reset role;

-- The owner's policies: the tables only Engram's SECURITY DEFINER functions write, in the
-- tenant bound to the transaction (allow), never another's (deny).
create function pg_temp.owner_reads(p_table text, p_policy text) returns setof text language plpgsql as $$
begin
    perform set_config('engram.tenant_id', pg_temp.a()::text, true);
    return next ok(pg_temp.seen('engram_owner', p_table) >= 1,
                   format('%s: the owner reads the bound tenant''s rows [policy %s allow]', p_table, p_policy));
    perform set_config('engram.tenant_id', pg_temp.b()::text, true);
    return next is(pg_temp.seen('engram_owner', p_table), 0,
                   format('%s: the owner sees nothing of another tenant [policy %s deny]', p_table, p_policy));
    perform set_config('engram.tenant_id', '', true);
end $$;
select * from pg_temp.owner_reads('memory.document_use', 'document_use__select_owner');
select * from pg_temp.owner_reads('memory.extractions', 'extractions__select_owner');
select * from pg_temp.owner_reads('memory.usage_daily', 'usage_daily__select_owner');
select * from pg_temp.owner_reads('memory.usage_ledger', 'usage_ledger__select_owner');
select * from pg_temp.owner_reads('memory.value_daily', 'value_daily__select_owner');
select * from pg_temp.owner_reads('knowledge.fact_content', 'fact_content__select_owner');
select set_config('engram.read_scopes', array[tests.scope('t-pr-a', 'team')]::text, true) is not null as bound;
select * from pg_temp.owner_reads('knowledge.fact_claim', 'fact_claim__select_owner');
select set_config('engram.read_scopes', '', true) is not null as unbound;

-- The owner's writes, through the functions that make them, as the application.
select tests.act_as('t-pr-a', 'alice', '{}', array['team']);
select lives_ok($$select knowledge.intern_content('a new sentence')$$,
                'fact_content: interned through the owner''s function [policy fact_content__insert_owner allow]');
select is((select knowledge.touch_claims(array[(select id from fx where name = 'c1')])), 1,
          'fact_claim: an access counted through the owner''s function [policy fact_claim__update_owner allow]');
select lives_ok($$insert into memory.usage_ledger (operation, channel, item_table, item_id)
                  values ('mark_used', 'python', 'sources.documents', (select id from fx where name = 'doc'))$$,
                'document_use: a use folded in by the owner''s trigger [policy document_use__update_owner allow]');
insert into memory.usage_ledger (operation, channel, item_table, item_id)
values ('recall', 'python', 'knowledge.fact_claim', (select id from fx where name = 'c1'));
select is(memory.aggregate_usage(current_date), 2,
          'usage_daily: the owner''s function updates a day''s count and adds an operation '
          '[policy usage_daily__update_owner allow] [policy usage_daily__insert_owner allow]');
select is(memory.refresh_value(current_date), 2,
          'value_daily: it updates the document''s uses and adds the claim '
          '[policy value_daily__update_owner allow] [policy value_daily__insert_owner allow]');
reset role;
select tests.act_as('t-pr-b', 'bob', '{}', array['team']);
select is(knowledge.touch_claims(array[(select id from fx where name = 'c1')]), 0,
          'fact_claim: the owner''s function counts nothing of another tenant [policy fact_claim__update_owner deny]');
reset role;
select is((select count(*)::int from memory.document_use where tenant_id = pg_temp.b()), 0,
          'document_use: a use of an unknown document folds into nothing [policy document_use__insert_owner deny]');
select is((select count(*)::int from memory.document_use where tenant_id = pg_temp.a()), 1,
          'document_use: the fixture''s document has its one row [policy document_use__insert_owner allow]');
select is((select uses from memory.document_use where tenant_id = pg_temp.a()), 2::bigint,
          'document_use: the second use was added to it');
-- Direct writes by the application are refused on every owner-only table.
select tests.act_as('t-pr-a', 'alice', '{}', array['team']);
select throws_ok($$insert into knowledge.fact_content (text) values ('direct')$$, '42501', null,
                 'fact_content: no direct insert [policy fact_content__insert_owner deny]');
select throws_ok($$update knowledge.fact_claim set access_count = 99$$, '42501', null,
                 'fact_claim: access counts are not the application''s to set [policy fact_claim__update_owner deny]');
select throws_ok($$update memory.document_use set uses = 0$$, '42501', null,
                 'document_use: no direct update [policy document_use__update_owner deny]');
select throws_ok($$insert into memory.usage_daily (day, operation, channel, operations, users)
                   values (current_date, 'x', 'python', 1, 1)$$, '42501', null,
                 'usage_daily: no direct insert [policy usage_daily__insert_owner deny]');
select throws_ok($$update memory.usage_daily set operations = 0$$, '42501', null,
                 'usage_daily: no direct update [policy usage_daily__update_owner deny]');
select throws_ok($$insert into memory.value_daily (day, item_table, item_id, uses, marks, users)
                   values (current_date, 'x', gen_random_uuid(), 1, 0, 1)$$, '42501', null,
                 'value_daily: no direct insert [policy value_daily__insert_owner deny]');
select throws_ok($$update memory.value_daily set uses = 0$$, '42501', null,
                 'value_daily: no direct update [policy value_daily__update_owner deny]');
select throws_ok($$insert into provenance.events (tenant_id, seq, recorded_at, table_name, row_id, operation,
                     actor_role, row_hash, prev_hash, hash)
                   values (pg_temp.a(), 999, now(), 'x', '{}', 'INSERT', 'x', '\x00', '\x00', '\x00')$$,
                 '42501', null, 'events: nobody but the chain writes events [policy events__insert_owner deny]');
select throws_ok($$select * from provenance.pending$$, '42501', null,
                 'pending: the application cannot read staged events [policy pending__all_owner deny]');
select throws_ok($$select * from provenance.pending_commits$$, '42501', null,
                 'pending_commits: nor the commit marks [policy pending_commits__all_owner deny]');
select throws_ok($$update recall.lexical_stats set chunks = 0$$, '42501', null,
                 'lexical_stats: the application only reads them [policy lexical_stats__all_owner deny]');
select throws_ok($$update engram.installation set value = 'x'$$, '42501', null,
                 'installation: the application only reads it [policy installation__all_owner deny]');
select throws_ok($$delete from worker.embedding_models$$, '42501', null,
                 'embedding_models: the application only reads the registry [policy embedding_models__all_owner deny]');
select throws_ok($$select auth.service_tenants()$$, '42501', null,
                 'tenants: the application cannot list every tenant [policy tenants__select_owner deny]');
select is((select count(*)::int from auth.scopes where tenant_id = pg_temp.b()), 0,
          'scopes: the application cannot read another tenant''s scope names [policy scopes__select_owner deny]');
reset role;
-- As the owner itself: what its functions read and write.
select is(pg_temp.seen('engram_owner', 'provenance.events'), (select count(*)::int from provenance.events
                                                                where tenant_id = pg_temp.a()),
          'events: the owner reads the chain to extend it [policy events__select_owner allow]');
select ok(pg_temp.seen('engram_owner', 'provenance.pending') >= 1,
          'pending: the owner reads the staged events [policy pending__all_owner allow]');
select ok(pg_temp.seen('engram_owner', 'provenance.pending_commits') >= 1,
          'pending_commits: and the commit marks [policy pending_commits__all_owner allow]');
select ok(pg_temp.seen('engram_owner', 'recall.lexical_stats') >= 1,
          'lexical_stats: the owner keeps them [policy lexical_stats__all_owner allow]');
select ok(pg_temp.touched('engram_owner', 'update engram.installation set value = value') >= 1,
          'installation: the owner records it [policy installation__all_owner allow]');
select ok(pg_temp.touched('engram_owner', 'update worker.embedding_models set dimension = dimension') >= 1,
          'embedding_models: the owner maintains the registry [policy embedding_models__all_owner allow]');
select ok(pg_temp.seen('engram_owner', 'auth.tenants', 'id') = 1,
          'tenants: the owner''s service functions read the tenants [policy tenants__select_owner allow]');
select ok(pg_temp.seen('engram_owner', 'auth.scopes') >= 1,
          'scopes: and their scopes [policy scopes__select_owner allow]');
select ok(pg_temp.seen('engram_owner', 'provenance.activities') >= 1,
          'activities: the owner reads activities to chain them [policy activities__select_owner allow]');
select set_config('tests.events', pg_temp.seen('engram_owner', 'provenance.events')::text, true) is not null as counted;
set constraints all immediate;
select ok(pg_temp.seen('engram_owner', 'provenance.events') > current_setting('tests.events')::int,
          'events: the chain, running as the owner, appends the staged write [policy events__insert_owner allow]');
select tests.act_as('t-pr-b', 'bob', array['team'], array['team']);
select is((select count(*)::int from provenance.activities where tenant_id = pg_temp.a()), 0,
          'activities: the owner''s read gives the application nothing of another tenant [policy activities__select_owner deny]');
reset role;
select is(pg_temp.seen('engram_app', 'provenance.events'), -1,
          'events: the application cannot read the chain at all [policy events__select_owner deny]');

-- The worker's own tables and the model registry.
select ok(pg_temp.seen('engram_worker', 'worker.embedding_cache') >= 1,
          'embedding_cache: the worker reads the cache [policy embedding_cache__select_worker allow]');
select is(pg_temp.seen('engram_app', 'worker.embedding_cache'), -1,
          'embedding_cache: the application cannot [policy embedding_cache__select_worker deny]');
select lives_ok($$select pg_temp.touched('engram_worker', format('insert into worker.embedding_cache (tenant_id, model, content_hash, embedding) values (%L, ''sentence-transformers/all-MiniLM-L6-v2'', ''\x03'', array_fill(0.1::real, array[384])::vector)', pg_temp.a()))$$,
                'embedding_cache: the worker adds a vector [policy embedding_cache__insert_worker allow]');
select throws_ok($$select pg_temp.touched('engram_app', format('insert into worker.embedding_cache (tenant_id, model, content_hash, embedding) values (%L, ''m'', ''\x04'', array_fill(0.1::real, array[384])::vector)', pg_temp.a()))$$,
                 '42501', null, 'embedding_cache: the application cannot [policy embedding_cache__insert_worker deny]');
select ok(pg_temp.touched('engram_worker', 'delete from worker.embed_retries') >= 1,
          'embed_retries: the worker keeps its retries [policy embed_retries__all_worker allow]');
select is(pg_temp.seen('engram_app', 'worker.embed_retries'), -1,
          'embed_retries: the application cannot see them [policy embed_retries__all_worker deny]');
select is(pg_temp.touched('engram_worker', 'update worker.embedding_models set activated_at = activated_at where active'), 1,
          'embedding_models: the worker flips the active model [policy embedding_models__update_worker allow]');
select throws_ok($$select pg_temp.touched('engram_app', 'update worker.embedding_models set activated_at = activated_at')$$,
                 '42501', null, 'embedding_models: the application cannot [policy embedding_models__update_worker deny]');
select tests.act_as('t-pr-a', 'alice', array['team'], '{}');
select ok((select count(*) from worker.embedding_models) >= 1,
          'embedding_models: everyone reads the registry [policy embedding_models__select_all allow]');
select ok((select count(*) from engram.installation) >= 1,
          'installation: everyone reads the index tier [policy installation__select_all allow]');
reset role;
select is(pg_temp.seen('engram_verifier', 'worker.embedding_models', null), -1,
          'embedding_models: a role the policy does not name reads nothing [policy embedding_models__select_all deny]');
select is(pg_temp.seen('engram_verifier', 'engram.installation', null), -1,
          'installation: nor the installation [policy installation__select_all deny]');

-- The DBA: tenants, scopes, shapes and settings of any tenant (allow); the application none (deny).
select tests.act_as_dba();
select lives_ok($$select auth.create_scope(pg_temp.a(), 'dba-made', 'by the DBA')$$,
                'scopes: the DBA creates a scope [policy scopes__all_dba allow]');
select lives_ok($$update auth.tenants set name = name where org_id = 't-pr-a'$$,
                'tenants: the DBA manages tenants [policy tenants__all_dba allow]');
select lives_ok($$update knowledge.shapes set max_count = 6 where tenant_id = pg_temp.a()$$,
                'shapes: the DBA defines shapes [policy shapes__all_dba allow]');
select lives_ok($$update knowledge.tenant_settings set strict_shapes = true where tenant_id = pg_temp.a()$$,
                'tenant_settings: the DBA sets them [policy tenant_settings__all_dba allow]');
select lives_ok($$insert into worker.embedding_models (name, dimension) values ('intfloat/e5-small-v2', 384)$$,
                'embedding_models: the DBA registers a candidate [policy embedding_models__insert_dba allow]');
select throws_ok($$insert into worker.embedding_models (name, dimension, active) values ('x/active', 384, true)$$,
                 '42501', null, 'embedding_models: not an active one [policy embedding_models__insert_dba deny]');
reset role;
select tests.act_as('t-pr-a', 'alice', array['team'], array['team']);
select throws_ok($$insert into auth.scopes (tenant_id, name, description) values (pg_temp.a(), 'x', 'x')$$,
                 '42501', null, 'scopes: the application cannot create one [policy scopes__all_dba deny]');
select throws_ok($$update auth.tenants set name = 'x'$$, '42501', null,
                 'tenants: nor rename a tenant [policy tenants__all_dba deny]');
select throws_ok($$update knowledge.shapes set max_count = 1$$, '42501', null,
                 'shapes: nor change a shape [policy shapes__all_dba deny]');
select throws_ok($$update knowledge.tenant_settings set strict_shapes = false$$, '42501', null,
                 'tenant_settings: nor the settings [policy tenant_settings__all_dba deny]');
reset role;

select * from finish();
rollback;
