-- Perspective partitions and conflicts: two opinions coexist, two world facts
-- conflict; value, time and relation conflicts are detected on write and on
-- demand; each resolution strategy closes the loser's validity, never deletes.
begin;
\ir helpers_knowledge.sql
select plan(30);

select tests.make_tenant('t-kc', array['team', 'ro']);
create temp table ids (name text primary key, id uuid);
grant select, insert on ids to public;
insert into ids values
    ('ann', tests.k_entity('t-kc', 'person', 'Ann', array['team'])),
    ('bob', tests.k_entity('t-kc', 'person', 'Bob', array['team'])),
    ('s-city', tests.k_shape('t-kc', 'lives_in', p_max => 1)),
    ('s-lang', tests.k_shape('t-kc', 'best_language', p_max => 1)),
    ('s-mgr', tests.k_shape('t-kc', 'manages', p_exclusive => array['reports_to']));
create function pg_temp.team() returns uuid[] language sql as $$ select tests.scopes('t-kc', array['team']) $$;
create function pg_temp.e(p text) returns uuid language sql as $$ select id from ids where name = p $$;
create function pg_temp.conflict(a text, b text) returns knowledge.conflicts language sql as $$
    select * from knowledge.conflicts
     where claim_a = least(pg_temp.e(a), pg_temp.e(b)) and claim_b = greatest(pg_temp.e(a), pg_temp.e(b))
$$;

-- perspectives: opinions of two collaborators coexist
select tests.act_as('t-kc', 'alice', '{}', array['team']);
insert into ids values ('op-alice', tests.k_claim(pg_temp.e('ann'), 'best_language', 'python', pg_temp.team(),
                                                   p_kind => 'opinion'));
reset role;
select tests.act_as('t-kc', 'bruno', '{}', array['team']);
insert into ids values ('op-bruno', tests.k_claim(pg_temp.e('ann'), 'best_language', 'rust', pg_temp.team(),
                                                   p_kind => 'opinion'));
select results_eq($$select perspective_key from knowledge.fact_claim where predicate = 'best_language' order by 1$$,
                  $$values ('user:alice'), ('user:bruno')$$, 'opinions are partitioned per creator');
select is_empty($$select 1 from knowledge.conflicts$$, 'two opposite opinions do not conflict');
select is((select count(*)::int from knowledge.current_claims where predicate = 'best_language'), 2,
          'both opinions stay current');
-- world facts share one partition and conflict on write
insert into ids values ('w-bruno', tests.k_claim(pg_temp.e('ann'), 'lives_in', 'Lisbon', pg_temp.team()));
reset role;
select tests.act_as('t-kc', 'alice', '{}', array['team']);
insert into ids values ('w-alice', tests.k_claim(pg_temp.e('ann'), 'lives_in', 'Porto', pg_temp.team(),
                                                  p_authority => 70));
select is((select perspective_key from knowledge.fact_claim where id = pg_temp.e('w-alice')), 'world',
          'world facts share the world partition');
select is((pg_temp.conflict('w-alice', 'w-bruno')).kind, 'value'::knowledge.conflict_kind,
          'two world facts on a functional predicate: a value conflict, detected on write');
select is((pg_temp.conflict('w-alice', 'w-bruno')).status, 'open'::knowledge.conflict_status, 'it starts open');
insert into ids values ('w-same', tests.k_claim(pg_temp.e('ann'), 'lives_in', 'Porto', pg_temp.team()));
select is((select count(*)::int from knowledge.conflicts), 2, 'agreeing claims do not conflict with each other');

-- time conflicts: overlapping validity only
insert into ids values
    ('t-1', tests.k_claim(pg_temp.e('bob'), 'lives_in', 'Rome', pg_temp.team(),
                          p_valid_from => '2020-01-01', p_valid_to => '2022-01-01')),
    ('t-2', tests.k_claim(pg_temp.e('bob'), 'lives_in', 'Milan', pg_temp.team(),
                          p_valid_from => '2022-01-01', p_valid_to => '2023-01-01')),
    ('t-3', tests.k_claim(pg_temp.e('bob'), 'lives_in', 'Turin', pg_temp.team(),
                          p_valid_from => '2021-06-01', p_valid_to => '2021-09-01'));
select is(pg_temp.conflict('t-1', 't-2'), null, 'adjacent validity periods do not conflict');
select is((pg_temp.conflict('t-1', 't-3')).kind, 'time'::knowledge.conflict_kind, 'overlapping validity: a time conflict');
select is(pg_temp.conflict('t-2', 't-3'), null, 'disjoint validity periods do not conflict');

-- relation conflicts: exclusive predicates on the same pair
insert into ids values
    ('r-1', tests.k_claim(pg_temp.e('ann'), 'manages', null, pg_temp.team(), p_object => pg_temp.e('bob'))),
    ('r-2', tests.k_claim(pg_temp.e('ann'), 'reports_to', null, pg_temp.team(), p_object => pg_temp.e('bob')));
select is((pg_temp.conflict('r-1', 'r-2')).kind, 'relation'::knowledge.conflict_kind,
          'exclusive predicates on the same pair: a relation conflict');
select is((pg_temp.conflict('r-1', 'r-2')).predicate, 'manages / reports_to', 'the conflict names both predicates');

-- on demand: conflicts the write path could not see (inserted by the superuser
-- with no identity bound, as an import would)
select tests.act_as_nobody();
reset role;
insert into knowledge.fact_claim (tenant_id, content_id, subject_id, predicate, object_value, scopes, author)
select tenant_id, content_id, subject_id, predicate, 'Faro', scopes, 'importer'
  from knowledge.fact_claim where id = pg_temp.e('w-bruno') returning id as w_import \gset
-- ... a predicate only a shape's exclusive_with names (0091's sweep keeps to shaped
-- predicates: this one is among them), and one no shape names (nothing to find)
insert into knowledge.fact_claim (tenant_id, content_id, subject_id, predicate, object_id, scopes, author)
select tenant_id, content_id, subject_id, predicate, object_id, scopes, 'importer'
  from knowledge.fact_claim where id = pg_temp.e('r-2');
insert into knowledge.fact_claim (tenant_id, content_id, subject_id, predicate, object_value, scopes, author)
select tenant_id, content_id, subject_id, 'mentioned_in', 'Faro', scopes, 'importer'
  from knowledge.fact_claim where id = pg_temp.e('w-bruno');
select tests.act_as('t-kc', 'alice', '{}', array['team']);
select is((select count(*)::int from knowledge.conflicts), 4, 'before the sweep: the imported claims'' conflicts are missing');
select is(knowledge.detect_conflicts(), 4, 'on demand: the sweep records the new conflicts (3 value, 1 relation)');
select is(knowledge.detect_conflicts(), 0, 'a second sweep records nothing twice');

-- strategies
select is(knowledge.resolve_conflict((pg_temp.conflict('w-alice', 'w-bruno')).id, 'highest_authority_wins'),
          pg_temp.e('w-alice'), 'highest authority wins');
select ok((select valid_to is not null and valid_to <= now() from knowledge.fact_claim where id = pg_temp.e('w-bruno')),
          'the loser''s validity is closed');
select is((select count(*)::int from knowledge.fact_claim where id = pg_temp.e('w-bruno')), 1, 'the loser is kept');
select is((select count(*)::int from knowledge.current_claims where id = pg_temp.e('w-bruno')), 0,
          'the loser is no longer current');
select throws_ok(format($$select knowledge.resolve_conflict(%L, 'newest_wins')$$,
                        (pg_temp.conflict('w-alice', 'w-bruno')).id), '55000', null,
                 'a resolved conflict cannot be resolved again');
select is(knowledge.resolve_conflict((pg_temp.conflict('t-1', 't-3')).id, 'newest_wins'), pg_temp.e('t-3'),
          'newest wins');
select is((select valid_to from knowledge.fact_claim where id = pg_temp.e('t-1')), '2021-06-01'::timestamptz,
          'time conflict: the loser''s validity ends where the winner''s begins');
select is(knowledge.resolve_conflict((pg_temp.conflict('r-1', 'r-2')).id, 'keep_both'), null, 'keep both');
select is((pg_temp.conflict('r-1', 'r-2')).status, 'disputed'::knowledge.conflict_status, 'kept both: disputed');
select is((select array_agg(disputed) from knowledge.current_claims where id in (pg_temp.e('r-1'), pg_temp.e('r-2'))),
          array[true, true], 'kept both: both claims stay current, flagged disputed');
select throws_ok(format($$select knowledge.resolve_conflict(%L, 'manual', %L)$$,
                        (select id from knowledge.conflicts where status = 'open' limit 1), pg_temp.e('ann')),
                 '22023', null, 'manual pick must name one of the two claims');
select is(knowledge.resolve_conflict((select id from knowledge.conflicts where status = 'open'
                                        and claim_b = greatest(pg_temp.e('w-same'), :'w_import'::uuid)
                                        and claim_a = least(pg_temp.e('w-same'), :'w_import'::uuid)),
                                     'manual', pg_temp.e('w-same')),
          pg_temp.e('w-same'), 'manual pick');
select throws_ok(format($$select knowledge.resolve_conflict(%L, 'highest_authority_wins')$$,
                        (select id from knowledge.conflicts where status = 'open' limit 1)),
                 '22023', null, 'equal authority: highest_authority_wins refuses with a reason');
reset role;

-- a read-only user cannot resolve
select tests.act_as('t-kc', 'rita', array['team'], '{}');
select throws_ok(format($$select knowledge.resolve_conflict(%L, 'newest_wins')$$,
                        (select id from knowledge.conflicts where status = 'open' limit 1)),
                 '42501', null, 'resolve deny: read-only scope');
reset role;
select is((select count(*)::int from knowledge.fact_claim where tenant_id = tests.tenant('t-kc')), 13,
          'no claim was ever deleted');

select * from finish();
rollback;
