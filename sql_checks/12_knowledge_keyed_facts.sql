-- Keyed facts: the newest as_of per key is current, and a current keyed fact
-- beats prose and lower-authority claims that contradict it.
begin;
\ir helpers_knowledge.sql
select plan(8);

select tests.make_tenant('t-kk', array['team']);
create temp table ids (name text primary key, id uuid);
grant select, insert on ids to public;
insert into ids values ('ann', tests.k_entity('t-kk', 'person', 'Ann', array['team']));
create function pg_temp.team() returns uuid[] language sql as $$ select tests.scopes('t-kk', array['team']) $$;
create function pg_temp.e(p text) returns uuid language sql as $$ select id from ids where name = p $$;

select tests.act_as('t-kk', 'alice', '{}', array['team']);
insert into ids values
    ('prose', tests.k_claim(pg_temp.e('ann'), 'title', 'intern', pg_temp.team(), p_authority => 90)),
    ('low-key', tests.k_claim(pg_temp.e('ann'), 'title', 'contractor', pg_temp.team(), p_authority => 10,
                              p_fact_key => 'hr.title.low', p_as_of => '2025-06-01')),
    ('old-key', tests.k_claim(pg_temp.e('ann'), 'title', 'engineer', pg_temp.team(), p_authority => 50,
                              p_fact_key => 'hr.title', p_as_of => '2024-01-01')),
    ('new-key', tests.k_claim(pg_temp.e('ann'), 'title', 'staff engineer', pg_temp.team(), p_authority => 50,
                              p_fact_key => 'hr.title', p_as_of => '2025-01-01')),
    ('agree', tests.k_claim(pg_temp.e('ann'), 'title', 'staff engineer', pg_temp.team()));

select results_eq($$select fact_key, object_value from knowledge.current_keyed_facts order by fact_key$$,
                  $$values ('hr.title', 'staff engineer'), ('hr.title.low', 'contractor')$$,
                  'the newest as_of per key is the current keyed fact');
select is((select beaten_by from knowledge.effective_claims where id = pg_temp.e('prose')), pg_temp.e('new-key'),
          'prose that contradicts a keyed fact is beaten, whatever its authority');
select is((select beaten_by from knowledge.effective_claims where id = pg_temp.e('low-key')), pg_temp.e('new-key'),
          'a lower-authority keyed fact that contradicts is beaten');
select is((select beaten_by from knowledge.effective_claims where id = pg_temp.e('old-key')), pg_temp.e('new-key'),
          'an older snapshot of the same key is beaten');
select is((select beaten_by from knowledge.effective_claims where id = pg_temp.e('agree')), null,
          'prose that agrees with the keyed fact stands');
select is((select beaten_by from knowledge.effective_claims where id = pg_temp.e('new-key')), null,
          'the current keyed fact stands');
select results_eq($$select object_value from knowledge.effective_claims where beaten_by is null order by 1$$,
                  $$values ('staff engineer'), ('staff engineer')$$, 'what recall keeps: the keyed value');
select throws_ok($$select tests.k_claim(pg_temp.e('ann'), 'title', 'x', pg_temp.team(), p_fact_key => 'hr.title',
                                       p_as_of => '2025-01-01')$$, '23505', null,
                 'one snapshot per key and as_of');
reset role;

select * from finish();
rollback;
