-- The embedding worker's role: it reads the texts it embeds and writes only the
-- embedding columns, across tenants; it cannot insert, delete, rewrite text or
-- read anything else. Also the model registry and the per-tenant vector cache.
begin;
select plan(32);

select tests.make_tenant('t-worker-a', array['team']);
select tests.make_tenant('t-worker-b', array['team']);
select tests.make_document('t-worker-a', 'a.md', array['team'], 'alpha words');
select tests.make_document('t-worker-b', 'b.md', array['team'], 'beta words');
select set_config('tests.tenant_a', tests.tenant('t-worker-a')::text, true);

select ok((select rolcanlogin and not rolsuper and not rolbypassrls and not rolcreaterole
             from pg_roles where rolname = 'engram_worker'),
          'engram_worker logs in, is no superuser and cannot bypass RLS');
select is_empty($$select c.relname from pg_class c where pg_get_userbyid(c.relowner) = 'engram_worker'
                  union all select n.nspname from pg_namespace n
                   where pg_get_userbyid(n.nspowner) = 'engram_worker'$$,
                'engram_worker owns nothing');
select is((select count(*)::int from worker.embedding_models where active), 1,
          'exactly one embedding model is active');
select has_trigger('sources', 'chunks', 'tg_chunks__notify_embed_insert',
                   'pending chunks NOTIFY the workers on insert');
select has_trigger('sources', 'chunks', 'tg_chunks__notify_embed_update',
                   'chunks that become pending again NOTIFY the workers');

-- as the worker
set local role engram_worker;
select results_eq($$select text from sources.chunks where text in ('alpha words', 'beta words') order by text$$,
                  $$values ('alpha words'), ('beta words')$$,
                  'worker select allow: the texts to embed, across tenants');
-- 0008's lexical-statistics trigger is a security definer, so the worker needs no
-- grant on recall's tables to write an embedding.
select lives_ok($$update sources.chunks set embedding = array_fill(0.1::real, array[384])::vector,
                    embed_state = 'ready', embed_model = 'sentence-transformers/all-MiniLM-L6-v2',
                    embedded_at = now(), embed_attempts = 1, embed_error = null
                  where text = 'alpha words'$$,
                'worker update allow: the embedding columns');
select throws_ok($$update sources.chunks set text = 'rewritten' where text = 'beta words'$$,
                 '42501', null, 'worker update deny: the text');
select throws_ok($$update sources.chunks set scopes = '{}' where text = 'beta words'$$,
                 '42501', null, 'worker update deny: the scope set');
select throws_ok($$insert into sources.chunks (tenant_id, document_id, ordinal, text, char_start, char_end)
                   select tenant_id, document_id, 5, 'x', 0, 1 from sources.chunks limit 1$$,
                 '42501', null, 'worker insert deny: chunks');
select throws_ok($$delete from sources.chunks$$, '42501', null, 'worker delete deny: chunks');
select throws_ok($$select lexical from sources.chunks limit 1$$, '42501', null,
                 'worker select deny: chunk columns it does not need');
select throws_ok($$select body from sources.documents limit 1$$, '42501', null,
                 'worker select deny: document bodies');
select lives_ok($$select scopes from sources.documents limit 1$$,
                'worker select allow: the document scope set the chunk trigger reads');
select throws_ok($$update sources.documents set title = 'x'$$, '42501', null,
                 'worker update deny: documents');
select throws_ok($$select * from auth.tenants$$, '42501', null, 'worker select deny: auth tables');
select throws_ok($$select name from auth.scopes$$, '42501', null,
                 'worker select deny: scope names and descriptions');
select lives_ok($$select tenant_id, id from auth.scopes$$,
                'worker select allow: scope ids, which memory triggers check on update');
select lives_ok($$insert into worker.embedding_cache (tenant_id, model, content_hash, embedding)
                  values (current_setting('tests.tenant_a')::uuid, 'sentence-transformers/all-MiniLM-L6-v2',
                          '\x01', array_fill(0.1::real, array[384])::vector)$$,
                'worker cache insert allow');
select throws_ok($$update worker.embedding_cache set embedding = embedding$$, '42501', null,
                 'worker cache update deny: a cached vector never changes');
select throws_ok($$delete from worker.embedding_cache$$, '42501', null, 'worker cache delete deny');
select lives_ok($$insert into worker.embed_retries (tenant_id, relation, row_key, retry_at, last_error)
                  values (current_setting('tests.tenant_a')::uuid, 'sources.chunks', 'k', now(), 'boom')$$,
                'worker retry bookkeeping allow');
select throws_ok($$insert into worker.embedding_models (name, dimension) values ('x/y', 8)$$,
                 '42501', null, 'worker registry insert deny: models are registered by a DBA');
reset role;

-- as the application
select tests.act_as('t-worker-a', 'alice', array['team'], '{}');
select results_eq($$select name from worker.embedding_models where active$$,
                  $$values ('sentence-transformers/all-MiniLM-L6-v2')$$,
                  'app select allow: the registry says which model is active');
select throws_ok($$select * from worker.embedding_cache$$, '42501', null, 'app select deny: the cache');
select throws_ok($$select * from worker.embed_retries$$, '42501', null, 'app select deny: retries');
select throws_ok($$update worker.embedding_models set active = false$$, '42501', null,
                 'app update deny: the registry');
reset role;

-- as a DBA
select tests.act_as_dba();
select lives_ok($$insert into worker.embedding_models (name, dimension) values ('intfloat/e5-small-v2', 384)$$,
                'dba registry insert allow: a candidate model');
select throws_ok($$insert into worker.embedding_models (name, dimension, active) values ('x/active', 384, true)$$,
                 '42501', null, 'dba registry insert deny: activating is the worker''s flip');
reset role;

-- the flip: the worker may switch the active model; two active ones are impossible
set local role engram_worker;
select throws_ok($$update worker.embedding_models set active = true where name = 'intfloat/e5-small-v2'$$,
                 '23505', null, 'a second active model is refused');
select lives_ok($$update worker.embedding_models set active = (name = 'intfloat/e5-small-v2'),
                    activated_at = now()$$, 'worker flip allow: one statement switches the active model');
reset role;
select is((select name from worker.embedding_models where active), 'intfloat/e5-small-v2',
          'after the flip the candidate is the one active model');

select * from finish();
rollback;
