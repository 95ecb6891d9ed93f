-- Client-chosen keys are unique per scope set (0020): a writer collides only with rows it can
-- read, so the constraint never tells it that a hidden row exists.
begin;
\ir helpers_knowledge.sql
select plan(10);

select tests.make_tenant('t-sk', array['board', 'hr']);
create temp table ids (name text primary key, id uuid);
grant select, insert on ids to public;
insert into ids values ('acme-hr', tests.k_entity('t-sk', 'organization', 'Acme', array['hr'])),
                       ('acme-board', tests.k_entity('t-sk', 'organization', 'Acme', array['board']));
create function pg_temp.e(p text) returns uuid language sql as $$ select id from ids where name = p $$;

select tests.act_as('t-sk', 'hannah', '{}', array['hr']);
select lives_ok($$insert into sources.documents (collection, path, title, body, scopes)
                  values ('notes', 'plan.md', 'HR plan', 'hr', tests.scopes('t-sk', array['hr']))$$,
                'hr writes notes/plan.md');
select lives_ok($$select tests.k_claim(pg_temp.e('acme-hr'), 'revenue', '10', tests.scopes('t-sk', array['hr']),
                                       p_fact_key => 'acme.revenue', p_as_of => '2024-01-01')$$,
                'hr writes the keyed fact acme.revenue as of 2024-01-01');
reset role;

select tests.act_as('t-sk', 'bert', '{}', array['board']);
select is_empty($$select 1 from sources.documents where path = 'plan.md'$$,
                'board cannot read hr''s notes/plan.md');
select lives_ok($$insert into sources.documents (collection, path, title, body, scopes)
                  values ('notes', 'plan.md', 'Board plan', 'board', tests.scopes('t-sk', array['board']))$$,
                'allow: board writes notes/plan.md in its own scope set, as at a free path');
select lives_ok($$select tests.k_claim(pg_temp.e('acme-board'), 'revenue', '12',
                                       tests.scopes('t-sk', array['board']),
                                       p_fact_key => 'acme.revenue', p_as_of => '2024-01-01')$$,
                'allow: board writes acme.revenue as of 2024-01-01 in its own scope set');
select throws_ok($$insert into sources.documents (collection, path, title, body, scopes)
                   values ('notes', 'plan.md', 'Again', 'again', tests.scopes('t-sk', array['board']))$$,
                 '23505', null, 'deny: the same path in the same scope set (a row the writer reads)');
select throws_ok($$select tests.k_claim(pg_temp.e('acme-board'), 'revenue', '13',
                                        tests.scopes('t-sk', array['board']),
                                        p_fact_key => 'acme.revenue', p_as_of => '2024-01-01')$$,
                 '23505', null, 'deny: the same keyed snapshot in the same scope set');
reset role;

select is((select count(*)::int from sources.documents
            where tenant_id = tests.tenant('t-sk') and path = 'plan.md'), 2,
          'two documents share the path, one per scope set');
select is((select count(*)::int from knowledge.fact_claim
            where tenant_id = tests.tenant('t-sk') and fact_key = 'acme.revenue'), 2,
          'two snapshots share the key and moment, one per scope set');
select tests.act_as('t-sk', 'carla', array['board', 'hr'], '{}');
select results_eq($$select title from sources.documents where path = 'plan.md' order by title$$,
                  $$values ('Board plan'), ('HR plan')$$, 'a reader of both scopes reads both');

select * from finish();
rollback;
