-- The chain is append-only for every role: UPDATE, DELETE and TRUNCATE are
-- refused for the app, the owner, the auditor and the verifier by grants and
-- policies, and for a superuser by triggers (only disabling them gets past,
-- which verification then detects). Writes append events, by trigger.
begin;
-- Chain at the end of each statement, not at commit (these transactions roll back).
set constraints all immediate;
select plan(26);

select tests.make_tenant('t-prov-ao', array['team']);
select tests.make_document('t-prov-ao', 'a.md', array['team'], 'alpha');

select ok((select count(*) from provenance.events where tenant_id = tests.tenant('t-prov-ao')) = 2,
          'a document and its chunk appended two events');
select ok((select array_agg(seq order by seq) = '{1,2}' from provenance.events
            where tenant_id = tests.tenant('t-prov-ao')), 'the tenant''s chain starts at 1, gap-free');

-- the application
select tests.act_as('t-prov-ao', 'alice', array['team'], array['team']);
select throws_ok('update provenance.events set actor_user = ''x''', '42501', null, 'app: UPDATE on the chain refused');
select throws_ok('delete from provenance.events', '42501', null, 'app: DELETE on the chain refused');
select throws_ok('truncate provenance.events', '42501', null, 'app: TRUNCATE on the chain refused');
select throws_ok($$insert into provenance.events (tenant_id, seq, recorded_at, table_name, row_id, operation,
                   actor_role, row_hash, prev_hash, hash) values (tests.tenant('t-prov-ao'), 99, now(), 'x', '{}',
                   'INSERT', 'x', sha256(''), sha256(''), sha256(''))$$, '42501', null,
                 'app: INSERT into the chain refused (only the trigger appends)');
select throws_ok('select count(*) from provenance.events', '42501', null, 'app: cannot even read the chain');
select throws_ok($$select provenance.append_events('sources.documents', 'INSERT', '{id}', array['{}'::jsonb])$$,
                 '42501', null, 'app: cannot call the internal append function');
select lives_ok($$update sources.documents set title = 'A' where path = 'a.md'$$,
                'app: its own write still works (the definer trigger appends for it)');
select lives_ok($$insert into provenance.derivations (derived_table, derived_row_id, source_table, source_row_id)
                  select 'sources.chunks', jsonb_build_object('id', c.id), 'sources.documents',
                         jsonb_build_object('id', c.document_id) from sources.chunks c$$,
                'app: records a derivation');
select lives_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                  values (sha256('q'), '[]', sha256('r'))$$, 'app: appends a receipt');
select throws_ok('delete from provenance.derivations', '42501', null, 'app: DELETE on derivations refused');
select throws_ok('update provenance.receipts set evidence = ''[]''', '42501', null, 'app: UPDATE on receipts refused');
reset role;
select is((select operation || ' by ' || actor_user || ' as ' || actor_role from provenance.events
            where tenant_id = tests.tenant('t-prov-ao') and table_name = 'sources.documents'
            order by seq desc limit 1),
          'UPDATE by alice as engram_app', 'the app''s update appended an event naming user and role');

-- the owner
set local role engram_owner;
select throws_ok('update provenance.events set actor_user = ''x''', '42501', null, 'owner: UPDATE on the chain refused');
select throws_ok('delete from provenance.events', '42501', null, 'owner: DELETE on the chain refused');
select throws_ok('truncate provenance.events', '42501', null, 'owner: TRUNCATE on the chain refused');
reset role;

-- the auditor
set local role engram_auditor;
select throws_ok('update provenance.events set actor_user = ''x''', '42501', null, 'auditor: UPDATE on the chain refused');
select throws_ok('delete from provenance.events', '42501', null, 'auditor: DELETE on the chain refused');
select throws_ok('delete from provenance.receipts', '42501', null, 'auditor: DELETE on receipts refused');
reset role;

-- a superuser still meets the triggers
select throws_ok('update provenance.events set actor_user = ''x''', '42501',
                 'provenance.events is append-only: UPDATE is refused', 'superuser: UPDATE stopped by trigger');
select throws_ok('delete from provenance.events', '42501',
                 'provenance.events is append-only: DELETE is refused', 'superuser: DELETE stopped by trigger');
select throws_ok('truncate provenance.events', '42501',
                 'provenance.events is append-only: TRUNCATE is refused', 'superuser: TRUNCATE stopped by trigger');
select throws_ok('delete from provenance.derivations', '42501',
                 'provenance.derivations is append-only: DELETE is refused', 'derivations are append-only');
select throws_ok('update provenance.receipts set asked_by = ''x''', '42501',
                 'provenance.receipts is append-only: UPDATE is refused', 'receipts are append-only');

select ok((select bool_and(ok) from provenance.verify_chain(tests.tenant('t-prov-ao'))),
          'the chain verifies after all the refused attempts');

select * from finish();
rollback;
