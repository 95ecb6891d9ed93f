-- The model registry's generation and text prefixes (0080_model_generations): who may
-- register a model, who may activate one, and that every activation raises the generation.
begin;
select plan(14);

select has_column('worker', 'embedding_models', 'generation', 'the registry has a generation');
select has_column('worker', 'embedding_models', 'query_prefix', 'each model has a query prefix');
select has_column('worker', 'embedding_models', 'passage_prefix', 'and a passage prefix');
select ok((select generation >= 1 from worker.embedding_models where active),
          'the active model has a generation');
select set_config('tests.before', (select max(generation)::text from worker.embedding_models), true);
select set_config('tests.was_active', (select name from worker.embedding_models where active), true);

-- engram_dba registers models (with their prefixes), never an active one, and never edits one.
select tests.act_as_dba();
select lives_ok($$insert into worker.embedding_models (name, dimension, query_prefix, passage_prefix)
                  values ('tests/e5', 384, 'query: ', 'passage: ')$$,
                'dba insert allow: a model with its prefixes');
select throws_ok($$insert into worker.embedding_models (name, dimension, active)
                   values ('tests/live', 384, true)$$, '42501', null,
                 'dba insert deny: an active model');
select throws_ok($$update worker.embedding_models set query_prefix = '' where name = 'tests/e5'$$,
                 '42501', null, 'dba update deny: a model''s prefixes are part of its vectors');
reset role;

-- The application reads the registry (recall compares generations), changes nothing.
select tests.act_as_nobody();
select is((select query_prefix from worker.embedding_models where name = 'tests/e5'), 'query: ',
          'app select allow: names, generations and prefixes');
select throws_ok($$update worker.embedding_models set active = (name = 'tests/e5')$$, '42501', null,
                 'app update deny: activation');
select throws_ok($$insert into worker.embedding_models (name, dimension) values ('x', 3)$$,
                 '42501', null, 'app insert deny: registration');
reset role;

-- The worker flips the active model; the generation follows by trigger, never by hand.
set local role engram_worker;
select throws_ok($$update worker.embedding_models set generation = 99 where name = 'tests/e5'$$,
                 '42501', null, 'worker update deny: the generation');
select throws_ok($$update worker.embedding_models set passage_prefix = '' where name = 'tests/e5'$$,
                 '42501', null, 'worker update deny: the prefixes');
update worker.embedding_models set active = false where active;
update worker.embedding_models set active = true where name = 'tests/e5';
reset role;
select is((select generation from worker.embedding_models where name = 'tests/e5'),
          current_setting('tests.before')::bigint + 1,
          'worker update allow: an activation raises the generation by one');
-- Back to the model that was active: a new generation again, never an old one.
set local role engram_worker;
update worker.embedding_models set active = false where active;
update worker.embedding_models set active = true where name = current_setting('tests.was_active');
reset role;
select is((select generation from worker.embedding_models where active),
          current_setting('tests.before')::bigint + 2,
          'reactivating a model gives it a new generation');

select * from finish();
rollback;
