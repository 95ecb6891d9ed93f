-- Which note gave an entity each alias (0087_document_aliases): the app may keep
-- knowledge.entities.given_aliases on the entities it may write, under the same RLS as
-- aliases; a reader may not; the column holds a JSON object only; a merge carries it to the
-- survivor (per document, the union) and clears the merged-away row's.
begin;
\ir helpers_knowledge.sql
select plan(8);

select tests.make_tenant('t-da', array['team', 'private']);
select tests.make_tenant('t-da2', array['team']);
create temp table ids as
    select tests.k_entity('t-da', 'person', 'Priya Raman', array['team']) as priya,
           tests.k_entity('t-da2', 'person', 'Priya Raman', array['team']) as other;
grant select on ids to public;

select tests.act_as('t-da', 'alice', array['team'], array['team']);
select lives_ok($$update knowledge.entities set given_aliases = '{"d1": ["PR"]}', aliases = array['PR']
                   where id = (select priya from ids)$$, 'a writer of the entity''s scopes keeps its given aliases');
select is((select given_aliases from knowledge.entities where id = (select priya from ids)),
          '{"d1": ["PR"]}'::jsonb, 'as written');
select throws_ok($$update knowledge.entities set given_aliases = '["PR"]' where id = (select priya from ids)$$,
                 '23514', null, 'given aliases are a JSON object (document id -> aliases)');
select is((select count(*)::int from knowledge.entities where given_aliases ? 'd1'), 1,
          'found by document id');
reset role;

select tests.act_as('t-da', 'rita', array['team'], '{}');
update knowledge.entities set given_aliases = '{}' where id = (select priya from ids);
reset role;
select is((select given_aliases from knowledge.entities where id = (select priya from ids)),
          '{"d1": ["PR"]}'::jsonb, 'deny: a reader of the scope changes nothing');

select tests.act_as('t-da', 'alice', array['team'], array['team']);
update knowledge.entities set given_aliases = '{"x": ["Y"]}' where id = (select other from ids);
reset role;
select is((select given_aliases from knowledge.entities where id = (select other from ids)),
          '{}'::jsonb, 'deny: another tenant''s entity is not touched');

select tests.act_as('t-da', 'alice', array['team'], array['team']);
create temp table m as
    select knowledge.resolve_entity('person', 'Priya R.', tests.scopes('t-da', array['team'])) as dup;
update knowledge.entities set aliases = array['Pri', 'PR'], given_aliases = '{"d1": ["Pri"], "d2": ["PR"]}'
 where id = (select dup from m);
select knowledge.merge_entities((select priya from ids), (select dup from m));
select is((select given_aliases from knowledge.entities where id = (select priya from ids)),
          '{"d1": ["PR", "Pri"], "d2": ["PR"]}'::jsonb, 'a merge carries which note gave which alias');
select is((select given_aliases from knowledge.entities where id = (select dup from m)),
          '{}'::jsonb, 'the merged-away row keeps none');
reset role;

select * from finish();
rollback;
