-- Markdown task items carry the words people ask for them with (0086_task_words):
-- sources.task_words gives them, and a chunk's lexical vector holds them beside its own words,
-- so the lexical lane's query "open & task" matches an open item's chunk and nothing else.
begin;
select plan(9);

select is(tsvector_to_array(sources.task_words(E'# Inbox\n- [ ] Renew the contract')),
          array['open', 'pend', 'task', 'to-do', 'todo'], 'an open item: open, pending, task, to-do, todo');
select is(tsvector_to_array(sources.task_words(E'1. [x] Signed off\n  * [X] Deployed')),
          array['complet', 'done', 'finish', 'task'], 'done items (numbered, nested): done, completed, finished, task');
select is(sources.task_words('a bracket [ ] inside a line, and [x] too'), ''::tsvector,
          'brackets inside a line are no task item');
select is(sources.task_words(E'-[ ] no space\n- [] empty\n- [y] other'), ''::tsvector,
          'a checkbox needs a list marker, a space and " " or x');
select is(sources.task_words(null), null, 'strict: no text, no words');

select tests.make_tenant('t-tw', array['team']) is not null as made;
create temp table ids as
    select tests.make_document('t-tw', 'inbox.md', array['team'], E'# Inbox\n- [ ] Renew Grafana') as inbox,
           tests.make_document('t-tw', 'notes.md', array['team'], 'Renew the lease. The task force met.') as notes;
grant select on ids to public;

select tests.act_as('t-tw', 'alice', array['team'], '{}');
select is((select array_agg(d.path order by d.path) from sources.chunks c
             join sources.documents d on d.tenant_id = c.tenant_id and d.id = c.document_id
            where c.lexical @@ to_tsquery('english', 'open & task')),
          array['inbox.md'], 'the lexical vector of the open item''s chunk answers "open tasks"');
select is((select array_agg(d.path order by d.path) from sources.chunks c
             join sources.documents d on d.tenant_id = c.tenant_id and d.id = c.document_id
            where c.lexical @@ to_tsquery('english', 'renew')),
          array['inbox.md', 'notes.md'], 'its own words as before');
select is((select c.token_count from sources.chunks c join ids on c.document_id = ids.inbox),
          length(to_tsvector('english', E'# Inbox\n- [ ] Renew Grafana'))
          + 5, 'the task words count in the chunk''s length (BM25)');
select is((select c.content_hash from sources.chunks c join ids on c.document_id = ids.inbox),
          sha256(convert_to(E'# Inbox\n- [ ] Renew Grafana', 'UTF8')), 'the text and its hash are as written');

select * from finish();
rollback;
