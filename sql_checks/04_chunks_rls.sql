-- Chunks: readable exactly when the document is (they inherit its scope set);
-- a chunk write needs write on the chunk's complete scope set.
begin;
select plan(13);

select tests.make_tenant('t-chunk-a', array['team', 'private', 'exec']);
select tests.make_tenant('t-chunk-b', array['team']);
select tests.make_document('t-chunk-a', 'team.md', array['team'], 'team words');
select tests.make_document('t-chunk-a', 'private.md', array['private'], 'private words');
select tests.make_document('t-chunk-a', 'shared.md', array['team', 'exec'], 'shared words');
select tests.make_document('t-chunk-b', 'b.md', array['team'], 'other tenant words');

select is((select c.scopes from sources.chunks c join sources.documents d on d.id = c.document_id
            where d.path = 'shared.md' and d.tenant_id = tests.tenant('t-chunk-a')),
          (select scopes from sources.documents where path = 'shared.md' and tenant_id = tests.tenant('t-chunk-a')),
          'a chunk carries its document''s scope set');

select tests.act_as('t-chunk-a', 'alice', array['team'], '{}');
select results_eq($$select text from sources.chunks order by text$$, $$values ('shared words'), ('team words')$$,
                  'chunk select allow: exactly the chunks of visible documents');
select is_empty($$select 1 from sources.chunks where text like 'private%' or text like 'other%'$$,
                'chunk select deny: chunks of hidden documents and other tenants');
select throws_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end)
                   select id, 1, 'more', 0, 4 from sources.documents where path = 'team.md'$$,
                 '42501', null, 'chunk insert deny: read-only on the document''s scope');
reset role;

select tests.act_as('t-chunk-a', 'alice', '{}', array['team']);
select lives_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end)
                  select id, 1, 'more team words', 0, 15 from sources.documents where path = 'team.md'$$,
                'chunk insert allow: write on the complete scope set');
select throws_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end)
                   values ((select id from sources.documents where path = 'shared.md'), 1, 'x', 0, 1)$$,
                 null, null, 'chunk insert deny: write on only part of the scope set');
select throws_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end)
                   values (gen_random_uuid(), 0, 'orphan', 0, 6)$$,
                 '23503', null, 'chunk insert deny: the document must exist and be visible');
select is_empty($$update sources.chunks set text = 'x' where text = 'shared words' returning 1$$,
                'chunk update deny: no write on every scope');
select results_eq($$update sources.chunks set scopes = '{}' where text = 'team words' returning cardinality(scopes)$$,
                  $$values (1)$$, 'a chunk''s scope set cannot be set apart from its document''s');
select results_eq($$update sources.chunks set text = 'team words v2' where text = 'team words' returning embed_state::text$$,
                  $$values ('pending')$$, 'chunk update allow; a text change re-queues the embedding');
reset role;

-- scope changes propagate from a document to its chunks
select tests.act_as('t-chunk-a', 'alice', '{}', array['team', 'exec']);
update sources.documents set scopes = array[tests.scope('t-chunk-a', 'exec')] where path = 'team.md';
reset role;
select is((select array_agg(distinct c.scopes) from sources.chunks c join sources.documents d on d.id = c.document_id
            where d.path = 'team.md' and d.tenant_id = tests.tenant('t-chunk-a')),
          array[array[tests.scope('t-chunk-a', 'exec')]], 'a document scope change propagates to every chunk');
select tests.act_as('t-chunk-a', 'alice', array['team'], '{}');
select is_empty($$select 1 from sources.chunks where text like 'team words%'$$,
                'after the change, the old scope no longer reads the chunks');
reset role;
select tests.act_as('t-chunk-a', 'alice', array['exec'], '{}');
select is((select count(*)::int from sources.chunks where text like '%team words%'), 2,
          'the new scope reads every chunk of the document');
reset role;

select * from finish();
rollback;
