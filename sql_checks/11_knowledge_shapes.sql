-- SHACL-style shapes: a failing claim lands in quarantine with the shape and the
-- reason, visible to its writer, releasable after correction; a shape change can
-- be dry-run. Structural bad input is refused and changes nothing.
begin;
\ir helpers_knowledge.sql
select plan(33);

select tests.make_tenant('t-ks', array['team', 'other']);
create temp table ids (name text primary key, id uuid);
grant select, insert on ids to public;
insert into ids values
    ('ann', tests.k_entity('t-ks', 'person', 'Ann', array['team'])),
    ('acme', tests.k_entity('t-ks', 'org', 'Acme', array['team'])),
    ('paris', tests.k_entity('t-ks', 'place', 'Paris', array['team'])),
    ('s-born', tests.k_shape('t-ks', 'born_on', p_max => 1, p_datatype => 'date', p_subject_type => 'person')),
    ('s-works', tests.k_shape('t-ks', 'works_for', p_datatype => 'entity', p_object_type => 'org')),
    ('s-email', tests.k_shape('t-ks', 'email', p_pattern => '^[^@\s]+@[^@\s]+$')),
    ('s-level', tests.k_shape('t-ks', 'level', p_allowed => array['junior', 'senior'])),
    ('s-skill', tests.k_shape('t-ks', 'skill', p_max => 2));
create function pg_temp.team() returns uuid[] language sql as $$ select tests.scopes('t-ks', array['team']) $$;
create function pg_temp.e(p text) returns uuid language sql as $$ select id from ids where name = p $$;

select tests.act_as('t-ks', 'alice', '{}', array['team']);
-- wrong datatype
select is(tests.k_claim(pg_temp.e('ann'), 'born_on', '1990', pg_temp.team(), p_datatype => 'integer'), null,
          'wrong datatype: not inserted');
select is((select reasons from knowledge.quarantine order by created_at desc, id desc limit 1),
          array['predicate born_on expects datatype date, not integer'], 'quarantine says why (datatype)');
select is((select shape_id from knowledge.quarantine order by created_at desc, id desc limit 1),
          pg_temp.e('s-born'), 'quarantine names the shape');
select is((select payload ->> 'object_value' from knowledge.quarantine order by created_at desc, id desc limit 1),
          '1990', 'quarantine keeps the original payload');
select is(current_setting('engram.last_quarantine', true),
          (select id::text from knowledge.quarantine order by created_at desc, id desc limit 1),
          'the writer learns the quarantine id of its statement');
-- subject type
select is(tests.k_claim(pg_temp.e('acme'), 'born_on', '1990-01-01', pg_temp.team(), p_datatype => 'date'), null,
          'wrong subject type: quarantined');
select ok((select reasons[1] like 'predicate born_on needs a subject of type person, not org'
             from knowledge.quarantine order by created_at desc, id desc limit 1), 'reason names the types');
-- object type
select is(tests.k_claim(pg_temp.e('ann'), 'works_for', null, pg_temp.team(), p_object => pg_temp.e('paris')), null,
          'wrong object type: quarantined');
-- pattern and allowed values
select is(tests.k_claim(pg_temp.e('ann'), 'email', 'not-an-email', pg_temp.team()), null, 'pattern: quarantined');
select is(tests.k_claim(pg_temp.e('ann'), 'level', 'wizard', pg_temp.team()), null, 'allowed values: quarantined');
select ok((select reasons[1] = 'value ''wizard'' of predicate level is not one of: junior, senior'
             from knowledge.quarantine order by created_at desc, id desc limit 1), 'reason lists the allowed values');
-- cardinality above one
select isnt(tests.k_claim(pg_temp.e('ann'), 'skill', 'sql', pg_temp.team()), null, 'cardinality: first value in');
select isnt(tests.k_claim(pg_temp.e('ann'), 'skill', 'python', pg_temp.team()), null, 'cardinality: second value in');
select is(tests.k_claim(pg_temp.e('ann'), 'skill', 'rust', pg_temp.team()), null, 'cardinality: third value quarantined');
-- conforming claims pass
select isnt(tests.k_claim(pg_temp.e('ann'), 'works_for', null, pg_temp.team(), p_object => pg_temp.e('acme')), null,
            'a conforming relation is inserted');
select is((select count(*)::int from knowledge.fact_claim), 3, 'only the conforming claims landed');
select is((select count(*)::int from knowledge.quarantine where status = 'held'), 6, 'every violation is held');
reset role;

-- strict shapes: unknown predicates are quarantined
insert into knowledge.tenant_settings (tenant_id, strict_shapes) values (tests.tenant('t-ks'), true);
select tests.act_as('t-ks', 'alice', '{}', array['team']);
select is(tests.k_claim(pg_temp.e('ann'), 'favourite_colour', 'blue', pg_temp.team()), null,
          'strict shapes: unknown predicate quarantined');
select is((select reasons from knowledge.quarantine order by created_at desc, id desc limit 1),
          array['unknown predicate favourite_colour: this tenant accepts only predicates with a shape'],
          'reason: unknown predicate');
reset role;

-- visible to the writer only (and readers of its scopes)
select tests.act_as('t-ks', 'mallory', '{}', array['other']);
select is_empty('select 1 from knowledge.quarantine', 'quarantine: invisible to other users outside its scopes');
reset role;

-- release after correction
select tests.act_as('t-ks', 'alice', '{}', array['team']);
select isnt(knowledge.release_quarantine(
                (select id from knowledge.quarantine where payload ->> 'object_value' = 'wizard'),
                '{"object_value": "senior"}'), null, 'release: the corrected claim is inserted');
select is((select status from knowledge.quarantine where payload ->> 'object_value' = 'wizard'), 'released',
          'release: the entry is marked released');
select is(knowledge.release_quarantine(
              (select id from knowledge.quarantine where payload ->> 'object_value' = 'not-an-email'),
              '{"object_value": "still wrong"}'), null, 'release: a still-failing correction stays held');
select is((select count(*)::int from knowledge.quarantine where status = 'held'), 6,
          'a failed release updates its entry instead of adding one');

-- dry-run of a shape change: report, nothing changed
select results_eq($$select reasons from knowledge.dry_run_shape('skill', p_allowed_values => array['sql'])$$,
                  $$values (array['value ''python'' of predicate skill is not one of: sql'])$$,
                  'dry-run reports the claims a new shape would reject');
select is((select count(*)::int from knowledge.fact_claim), 4, 'dry-run changed no claim');
reset role;
select is((select allowed_values from knowledge.shapes where predicate = 'skill'), null, 'dry-run changed no shape');

-- structural bad input: refused with a clear reason, nothing lands anywhere
select tests.act_as('t-ks', 'alice', '{}', array['team']);
select throws_ok($$select tests.k_claim(pg_temp.e('ann'), 'level', 'senior', pg_temp.team(), p_confidence => 1.5)$$,
                 '23514', null, 'confidence above 1 is refused');
select throws_ok($$select tests.k_claim(pg_temp.e('ann'), 'level', 'senior', pg_temp.team(),
                                       p_valid_from => '2024-05-01', p_valid_to => '2024-01-01')$$,
                 '23514', null, 'valid-to before valid-from is refused');
select throws_ok($$select tests.k_claim(pg_temp.e('ann'), 'level', 'senior', pg_temp.team(),
                                       p_valid_from => '2024-13-45')$$,
                 '22008', null, 'a malformed date is refused');
select throws_ok($$select tests.k_claim(pg_temp.e('ann'), 'born_on', '1990-02-30', pg_temp.team(), p_datatype => 'date')$$,
                 '22P02', 'object value ''1990-02-30'' is not a valid date', 'a malformed date literal is refused by name');
select is((select count(*)::int from knowledge.fact_claim), 4, 'refused input added no claim');
select is((select count(*)::int from knowledge.quarantine), 7, 'refused input added no quarantine entry');
reset role;

select * from finish();
rollback;
