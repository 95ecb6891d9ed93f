-- Embedding state that can only be true (0081_embedding_progress): the document and entity
-- columns nothing kept up to date are gone, the triggers that wrote them still work, and a
-- document's progress (read from its chunks) shows only to those who may read the chunks.
begin;
\ir helpers_knowledge.sql
select plan(9);

select tests.make_tenant('t-ep-a', array['team']);
select tests.make_tenant('t-ep-b', array['team']);
select set_config('tests.doc', tests.make_document('t-ep-a', 'p.md', array['team'], 'progress words')::text,
                  true);

select hasnt_column('sources', 'documents', 'embed_state', 'documents carry no embedding state');
select hasnt_column('knowledge', 'entities', 'embed_state', 'entities carry no embedding state');
select hasnt_column('knowledge', 'entities', 'embedding', 'nor an entity vector');

select tests.act_as('t-ep-a', 'alice', '{}', array['team']);
select lives_ok($$update sources.documents set body = 'changed progress words'
                  where id = current_setting('tests.doc')::uuid$$,
                'a body change still passes the document trigger');
select lives_ok($$select knowledge.resolve_entity('person', 'Ann Lee', tests.scopes('t-ep-a', array['team']))$$,
                'an entity is still resolved (created)');
select lives_ok($$update knowledge.entities set summary = 'Leads the team' where name_key = 'ann lee'$$,
                'a summary change still passes the entity trigger');
select results_eq($$select embed_state::text, count(*)::int from sources.chunks
                    where document_id = current_setting('tests.doc')::uuid group by 1$$,
                  $$values ('pending', 1)$$,
                  'progress allow: the writer counts the document''s chunks by state');

select tests.act_as('t-ep-b', 'bob', array['team'], '{}');
select is((select count(*)::int from sources.chunks where document_id = current_setting('tests.doc')::uuid),
          0, 'progress deny: another tenant counts none of them');
select tests.act_as('t-ep-a', 'carol', '{}', '{}');
select is((select count(*)::int from sources.chunks where document_id = current_setting('tests.doc')::uuid),
          0, 'progress deny: a user without the scope counts none of them');

select * from finish();
rollback;
