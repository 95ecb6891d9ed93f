-- memory.job_runs (0030): derive runs that failed or skipped an item. Allow and deny for
-- every policy; a run is readable only by a reader of every scope it covered, written by
-- its own identity into scopes it may write, never updated, pruned only by the service.
begin;
select plan(14);

select tests.make_tenant('t-jr-a', array['team', 'hr']) is not null as made;
select tests.make_tenant('t-jr-b', array['team']) is not null as made;

create function pg_temp.record_run(p_org text, p_scopes text[]) returns void language sql as $$
    insert into memory.job_runs (job, ok, line, skipped, problems, scopes, started_at)
    values ('extract', true, 'read 3 chunks; 1 skipped', 1,
            '[{"item": "chunk 1 of notes/a.md", "reason": "too long"}]', tests.scopes(p_org, p_scopes), now())
$$;

-- insert
select tests.act_as('t-jr-a', 'alice', '{}', array['team', 'hr']);
select lives_ok($$select pg_temp.record_run('t-jr-a', array['team', 'hr'])$$,
                'job_runs: a run covering the scopes one writes is recorded [policy job_runs__insert_app allow]');
select is((select run_by from memory.job_runs), 'alice', 'job_runs: run_by is the bound user');
reset role;
select tests.act_as('t-jr-a', 'bob', array['hr'], array['team']);
select throws_ok($$select pg_temp.record_run('t-jr-a', array['team', 'hr'])$$, '42501', null,
                 'job_runs: a run covering a scope one only reads is refused [policy job_runs__insert_app deny]');
select throws_ok($$insert into memory.job_runs (job, ok, line, scopes, started_at, run_by)
                   values ('extract', true, 'x', tests.scopes('t-jr-a', array['team']), now(), 'alice')$$,
                 '42501', null, 'job_runs: run_by cannot be chosen (no column grant)');
reset role;

-- select
select tests.act_as('t-jr-a', 'carol', array['team', 'hr'], '{}');
select is((select count(*)::int from memory.job_runs), 1,
          'job_runs: a reader of every scope of the run sees it [policy job_runs__select_app allow]');
reset role;
select tests.act_as('t-jr-a', 'dave', array['team'], array['team']);
select is((select count(*)::int from memory.job_runs), 0,
          'job_runs: a reader of only one scope of the run does not [policy job_runs__select_app deny]');
reset role;
select tests.act_as('t-jr-b', 'alice', array['team'], array['team']);
select is((select count(*)::int from memory.job_runs), 0, 'job_runs: another tenant sees nothing');
reset role;
select tests.act_as_nobody();
select is((select count(*)::int from memory.job_runs), 0, 'job_runs: no identity sees nothing');
reset role;

-- update and delete
select tests.act_as('t-jr-a', 'alice', array['team', 'hr'], array['team', 'hr']);
select throws_ok($$update memory.job_runs set ok = false$$, '42501', null,
                 'job_runs: a run is never updated (no grant)');
delete from memory.job_runs;
reset role;
select tests.act_as('t-jr-a', 'alice', array['team', 'hr'], '{}');
select is((select count(*)::int from memory.job_runs), 1,
          'job_runs: a user cannot delete a run, even one of their own [policy job_runs__delete_service deny]');
reset role;
select set_config('role', 'engram_app', true);
select auth.bind_service_identity('t-jr-a', array['team', 'hr']);
select is((select count(*)::int from memory.job_runs), 1, 'job_runs: the service reads every run of its tenant');
delete from memory.job_runs;
select is((select count(*)::int from memory.job_runs), 0,
          'job_runs: the service prunes runs [policy job_runs__delete_service allow]');
reset role;

-- the chain
select has_trigger('memory', 'job_runs', 'tg_job_runs__chain_insert', 'job_runs: chained');
select throws_ok($$insert into memory.job_runs (tenant_id, job, ok, line, scopes, started_at)
                   values (tests.tenant('t-jr-a'), 'x', true, 'x', '{}', now())$$, '23514', null,
                 'job_runs: a run covers at least one scope');

select * from finish();
rollback;
