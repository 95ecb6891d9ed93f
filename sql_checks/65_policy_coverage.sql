-- Policy coverage: every row level security policy of Engram's schemas has a pgTAP case
-- that it allows and a case that it denies.
--
-- A case says which policy it exercises in its description: "[policy <name> allow]" or
-- "[policy <name> deny]" (several tags may share one case). The pytest runner
-- (tests/test_pgtap.py) runs every other file first, keeps the tags of the cases that
-- passed, loads them into tests.policy_cases (policy, kind, file, description), and runs
-- this file last. So a case counts only when it ran and passed in the same run, a new
-- policy without cases fails here by name, and a tag naming no policy (a typo, a dropped
-- policy) fails too. Run alone (e.g. by pg_prove) the registry is empty and every check
-- below fails, which is the point.
begin;
select plan(5);

create temp view engram_policies as
    select p.policyname as policy, n.nspname || '.' || c.relname as table_name
      from pg_policy pol
      join pg_class c on c.oid = pol.polrelid
      join pg_namespace n on n.oid = c.relnamespace
      join pg_policies p on p.schemaname = n.nspname and p.tablename = c.relname and p.policyname = pol.polname
     where pg_get_userbyid(n.nspowner) = 'engram_owner';

select ok((select count(*) from tests.policy_cases) > 0,
          'the runner loaded the tags of this run''s passing cases');
select is_empty($$select policy from engram_policies group by policy having count(*) > 1$$,
                'policy names are unique across Engram''s schemas, so a tag names exactly one policy');
select is_empty($$select table_name || ' ' || policy from engram_policies p
                   where not exists (select 1 from tests.policy_cases c where c.policy = p.policy and c.kind = 'allow')
                   order by 1$$,
                'every policy has a passing allow case');
select is_empty($$select table_name || ' ' || policy from engram_policies p
                   where not exists (select 1 from tests.policy_cases c where c.policy = p.policy and c.kind = 'deny')
                   order by 1$$,
                'every policy has a passing deny case');
select is_empty($$select distinct c.policy || ' (' || c.file || ')' from tests.policy_cases c
                   where not exists (select 1 from engram_policies p where p.policy = c.policy) order by 1$$,
                'every tag names a policy that exists');

select diag(format('policy coverage: %s policies; %s allow and %s deny cases passed (%s tagged cases in %s files)',
                   (select count(*) from engram_policies),
                   (select count(distinct (policy, file, description)) from tests.policy_cases where kind = 'allow'),
                   (select count(distinct (policy, file, description)) from tests.policy_cases where kind = 'deny'),
                   (select count(*) from tests.policy_cases),
                   (select count(distinct file) from tests.policy_cases)));

select * from finish();
rollback;
