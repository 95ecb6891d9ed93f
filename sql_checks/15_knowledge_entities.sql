-- Entity resolution and merge in SQL, the guards that keep claims records, and
-- the column grants of the knowledge tables.
begin;
\ir helpers_knowledge.sql
select plan(33);

select tests.make_tenant('t-ke', array['team', 'private']);
create temp table ids (name text primary key, id uuid);
grant select, insert on ids to public;
create function pg_temp.e(p text) returns uuid language sql as $$ select id from ids where name = p $$;
create function pg_temp.team() returns uuid[] language sql as $$ select tests.scopes('t-ke', array['team']) $$;

select tests.act_as('t-ke', 'alice', '{}', array['team']);
insert into ids values ('ann', knowledge.resolve_entity('person', 'Ann  Lee', pg_temp.team()));
select is(knowledge.resolve_entity('person', 'ann lee!', pg_temp.team()), pg_temp.e('ann'),
          'resolution: case, blanks and punctuation are normalised');
select is((select name_key from knowledge.entities where id = pg_temp.e('ann')), 'ann lee', 'the normalised key');
update knowledge.entities set aliases = array['Annie L.'] where id = pg_temp.e('ann');
select is(knowledge.resolve_entity('person', 'ANNIE L', pg_temp.team()), pg_temp.e('ann'), 'resolution: alias match');
select isnt(knowledge.resolve_entity('org', 'Ann Lee', pg_temp.team()), pg_temp.e('ann'),
            'resolution: another type is another entity');
select is(knowledge.resolve_entity('person', 'Nobody', pg_temp.team(), false), null,
          'resolution without create: null when unknown');
select throws_ok($$select knowledge.resolve_entity('person', '  ...  ', pg_temp.team())$$, '22023', null,
                 'a name without letters or digits is refused');
insert into ids values ('bob', knowledge.resolve_entity('person', 'Bob', pg_temp.team())),
                       ('robert', knowledge.resolve_entity('person', 'Robert', pg_temp.team())),
                       ('acme', knowledge.resolve_entity('org', 'Acme', pg_temp.team()));
insert into ids values ('c-bob', tests.k_claim(pg_temp.e('bob'), 'hobby', 'chess', pg_temp.team())),
                       ('c-acme', tests.k_claim(pg_temp.e('acme'), 'employs', null, pg_temp.team(),
                                                p_object => pg_temp.e('bob')));
-- guards
select throws_ok($$update knowledge.fact_claim set subject_id = pg_temp.e('robert') where id = pg_temp.e('c-bob')$$,
                 '42501', 'a claim''s subject changes only by merging its entity', 'guard: no arbitrary subject change');
-- merge
select is(knowledge.merge_entities(pg_temp.e('robert'), pg_temp.e('bob')), pg_temp.e('robert'), 'merge returns the survivor');
select is((select subject_id from knowledge.fact_claim where id = pg_temp.e('c-bob')), pg_temp.e('robert'),
          'merge repoints subjects');
select is((select object_id from knowledge.fact_claim where id = pg_temp.e('c-acme')), pg_temp.e('robert'),
          'merge repoints objects');
select is(knowledge.canonical_entity(pg_temp.e('bob')), pg_temp.e('robert'), 'the merged-away id stays resolvable');
select is((select merged_into from knowledge.entities where id = pg_temp.e('bob')), pg_temp.e('robert'),
          'the merged row is kept');
select is(knowledge.resolve_entity('person', 'bob', pg_temp.team()), pg_temp.e('robert'),
          'the merged name is now an alias of the survivor');
insert into ids values ('c-golf', tests.k_claim(pg_temp.e('bob'), 'sport', 'golf', pg_temp.team()));
select is((select subject_id from knowledge.fact_claim where id = pg_temp.e('c-golf')), pg_temp.e('robert'),
          'a new claim about the merged-away id lands on the survivor');
select throws_ok($$select knowledge.merge_entities(pg_temp.e('robert'), pg_temp.e('bob'))$$, 'P0002', null,
                 'an entity cannot be merged twice');
select throws_ok($$update knowledge.entities set merged_into = null where id = pg_temp.e('bob')$$, '42501', null,
                 'a merge cannot be undone by clearing merged_into');
select throws_ok($$update knowledge.entities set merged_into = pg_temp.e('bob') where id = pg_temp.e('acme')$$,
                 '22023', null, 'nothing merges into a merged-away entity (no chains, no loops)');
reset role;
select tests.act_as('t-ke', 'rita', array['team'], '{}');
select throws_ok($$select knowledge.merge_entities(pg_temp.e('robert'), pg_temp.e('acme'))$$, '42501', null,
                 'merge deny: read-only scope');
reset role;

-- column grants: computed and identity columns are not writable by the app
select column_privs_are('knowledge', 'fact_claim', 'tenant_id', 'engram_app', array['SELECT'],
                        'app cannot write fact_claim.tenant_id');
select column_privs_are('knowledge', 'fact_claim', 'perspective_key', 'engram_app', array['SELECT'],
                        'app cannot write the perspective key (computed)');
select column_privs_are('knowledge', 'fact_claim', 'author', 'engram_app', array['SELECT'],
                        'app cannot write the author (the bound user)');
select column_privs_are('knowledge', 'fact_claim', 'access_count', 'engram_app', array['SELECT'],
                        'app cannot write access counters (touch_claims does)');
select table_privs_are('knowledge', 'fact_content', 'engram_app', array['SELECT'],
                       'app: fact_content read-only (intern_content inserts)');
select table_privs_are('knowledge', 'shapes', 'engram_app', array['SELECT'], 'app: shapes read-only');
select table_privs_are('knowledge', 'fact_claim', 'engram_auditor', '{}', 'auditor: no access to claims');

-- relations: claims whose object is an entity, indexed both ways for graph walks
select has_index('knowledge', 'fact_claim', 'ix_fact_claim_tenant_id_subject_id', array['tenant_id', 'subject_id'],
                 'relations: btree on (tenant, subject)');
select has_index('knowledge', 'fact_claim', 'ix_fact_claim_tenant_id_object_id', array['tenant_id', 'object_id'],
                 'relations: btree on (tenant, object)');
select tests.act_as('t-ke', 'rita', array['team'], '{}');
select results_eq($$select predicate, object_id from knowledge.relations$$,
                  $$select 'employs'::text, pg_temp.e('robert')$$, 'the relations view holds only entity objects');
reset role;
select tests.act_as('t-ke', 'pat', array['private'], '{}');
select is_empty($$select 1 from knowledge.relations$$, 'relations: invisible outside their scopes');
reset role;
select column_privs_are('memory', 'episodes', 'user_id', 'engram_app', array['SELECT'],
                        'app cannot record an episode as another user');
select table_privs_are('knowledge', 'fact_claim', 'engram_dba', '{}', 'dba: reads no claims');
select tests.act_as_dba();
select lives_ok($$insert into knowledge.shapes (tenant_id, predicate, max_count)
                  values (tests.tenant('t-ke'), 'birthday', 1)$$, 'dba: defines a shape');
reset role;
select tests.act_as('t-ke', 'rita', array['team'], '{}');
select is((select max_count from knowledge.shapes where predicate = 'birthday'), 1, 'app: reads its tenant''s shapes');
reset role;

select * from finish();
rollback;
