-- Read policies test the reader's scopes as pg_catalog.arrayoverlap(scopes, read_scopes):
-- the && operator's 1% default selectivity made the planner estimate every tenant scan
-- under RLS at a hundredth of its rows (db/versions/0015_rls_estimates.py). A later
-- revision that writes a policy with && fails here; so does one that loses a read test.
begin;
select plan(4);

create temp view reader_policies as
    select schemaname || '.' || tablename || ' ' || policyname as policy,
           coalesce(qual, '') || ' ' || coalesce(with_check, '') as expr
      from pg_policies
     where coalesce(qual, '') || coalesce(with_check, '') like '%auth.read_scopes()%';

select ok((select count(*) from reader_policies) >= 19,
          'every tenant table''s read policy tests the reader''s scopes');

select is_empty($$
    select policy from reader_policies where expr ~ '&&\s*\(\s*SELECT auth\.read_scopes\(\)'
$$, 'no policy tests the reader''s scopes with the && operator');

select is_empty($$
    select policy from reader_policies where expr not like '%arrayoverlap(scopes, ( SELECT auth.read_scopes()%'
$$, 'every read policy spells the test arrayoverlap(scopes, (select auth.read_scopes()))');

-- The estimate itself: a reader's scan of their tenant's documents is estimated within
-- a small factor of the same scan without the policy (the && spelling gave a hundredth).
create function tests.plan_rows(p_query text) returns double precision language plpgsql as $$
declare
    v_plan json;
begin
    execute 'explain (format json) ' || p_query into v_plan;
    return (v_plan -> 0 -> 'Plan' ->> 'Plan Rows')::double precision;
end $$;
select tests.make_tenant('t-est', array['team']);
select tests.make_document('t-est', 'doc-' || n || '.md', array['team']) from generate_series(1, 300) n;
analyze sources.documents;
select auth.bind_identity('t-est', 'alice', array['team'], '{}');
create temp table est as
    -- The policy's own tenant test, spelled the same way (an InitPlan), so only the scope
    -- test differs between the two estimates.
    select tests.plan_rows('select * from sources.documents '
                           'where tenant_id = (select auth.tenant_id())') as open;
grant select on est to engram_app;
select tests.act_as('t-est', 'alice', array['team'], '{}');
select cmp_ok(tests.plan_rows('select * from sources.documents'), '>=', (select open / 5 from est),
              'under RLS the planner estimates a tenant scan at no less than a fifth of it');
reset role;

select * from finish();
rollback;
