-- knowledge.resolve_entity_within (0022): a mention resolves only to an entity shared into every
-- scope of the mention, else a new one in those scopes.
begin;
\ir helpers_knowledge.sql
select plan(8);

select tests.make_tenant('t-rw', array['board', 'hr']);
create temp table ids (name text primary key, id uuid);
grant select, insert on ids to public;
insert into ids values ('bob-hr', tests.k_entity('t-rw', 'person', 'Robert Quill', array['hr'], array['Bob'])),
                       ('ann-both', tests.k_entity('t-rw', 'person', 'Ann Lee', array['board', 'hr']));
create function pg_temp.e(p text) returns uuid language sql as $$ select id from ids where name = p $$;

select tests.act_as('t-rw', 'service', '{}', array['board', 'hr']);
select is(knowledge.resolve_entity('person', 'Bob', tests.scopes('t-rw', array['board'])), pg_temp.e('bob-hr'),
          'resolve_entity (unchanged) finds any visible entity by alias');
select isnt(knowledge.resolve_entity_within('person', 'Bob', tests.scopes('t-rw', array['board'])),
            pg_temp.e('bob-hr'), 'deny: a board mention never resolves to the hr entity');
select is((select canonical_name from knowledge.entities
            where id = knowledge.resolve_entity_within('person', 'Bob', tests.scopes('t-rw', array['board']))),
          'Bob', 'it makes (then finds) a board entity named as mentioned');
select is((select count(*)::int from knowledge.entities where name_key = 'bob'), 1,
          'one board Bob, however often it is mentioned');
select is(knowledge.resolve_entity_within('person', 'Ann Lee', tests.scopes('t-rw', array['board'])),
          pg_temp.e('ann-both'), 'allow: an entity shared into every scope of the mention is found');
select is(knowledge.resolve_entity_within('person', 'Nobody', tests.scopes('t-rw', array['hr']), false),
          null, 'without create, no match is null');
select throws_ok($$select knowledge.resolve_entity_within('person', 'X', '{}'::uuid[])$$, '22023', null,
                 'a mention is resolved within at least one scope');
reset role;
select tests.act_as_nobody();
select throws_ok($$select knowledge.resolve_entity_within('person', 'Bob', tests.scopes('t-rw', array['board']))$$,
                 '28000', null, 'deny: nothing bound, nothing resolved');

select * from finish();
rollback;
