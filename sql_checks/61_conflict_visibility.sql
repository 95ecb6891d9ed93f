-- A conflict is readable only with read access to both claims and the subject (0021); a writer
-- who cannot read the subject records none (and is not refused for it).
begin;
\ir helpers_knowledge.sql
select plan(7);

select tests.make_tenant('t-cv', array['board', 'hr', 'eng']);
create temp table ids (name text primary key, id uuid);
grant select, insert on ids to public;
insert into ids values ('acme', tests.k_entity('t-cv', 'organization', 'Acme', array['board', 'hr'])),
                       ('secret', tests.k_entity('t-cv', 'organization', 'Hidden Co', array['eng'])),
                       ('s-ceo', tests.k_shape('t-cv', 'ceo', p_max => 1));
create function pg_temp.e(p text) returns uuid language sql as $$ select id from ids where name = p $$;

select tests.act_as('t-cv', 'bert', '{}', array['board']);
insert into ids values ('c-board', tests.k_claim(pg_temp.e('acme'), 'ceo', 'Ann', tests.scopes('t-cv', array['board'])));
reset role;
select tests.act_as('t-cv', 'hannah', '{}', array['hr']);
insert into ids values ('c-hr', tests.k_claim(pg_temp.e('acme'), 'ceo', 'Bo', tests.scopes('t-cv', array['hr'])));
reset role;
-- The sweep, as someone who reads everything.
select tests.act_as('t-cv', 'service', '{}', array['board', 'hr', 'eng']);
select is(knowledge.detect_conflicts(), 1, 'the sweep records the board/hr conflict');
reset role;

select tests.act_as('t-cv', 'bert', array['board'], '{}');
select is_empty($$select 1 from knowledge.conflicts$$,
                'deny: a reader of board alone does not see a conflict with an hr claim');
reset role;
select tests.act_as('t-cv', 'carla', array['board', 'hr'], '{}');
select is((select count(*)::int from knowledge.conflicts), 1, 'allow: a reader of both claims sees it');
reset role;
select tests.act_as('t-cv', 'dora', array['hr', 'eng'], '{}');
select is_empty($$select 1 from knowledge.conflicts$$, 'deny: hr and eng read one claim only');
reset role;

-- Claims about a subject the writer cannot read: no conflict recorded for it, no refusal.
select tests.act_as('t-cv', 'erin', array['eng'], array['board']);
insert into ids values ('x-1', tests.k_claim(pg_temp.e('secret'), 'ceo', 'Cy', tests.scopes('t-cv', array['board'])));
reset role;
select tests.act_as('t-cv', 'fred', array['eng'], array['board']);
select lives_ok($$select tests.k_claim(pg_temp.e('secret'), 'ceo', 'Di', tests.scopes('t-cv', array['board']))$$,
                'a second claim about a subject the writer reads lands');
reset role;
select tests.act_as('t-cv', 'gil', '{}', array['board']);
select lives_ok($$select knowledge.detect_conflicts()$$,
                'a sweep by a writer who cannot read the subject is not refused');
reset role;
select tests.act_as('t-cv', 'bert', array['board'], '{}');
select is_empty($$select 1 from knowledge.conflicts where subject_id = pg_temp.e('secret')$$,
                'deny: board reads both claims but not the subject: no conflict shown');

select * from finish();
rollback;
