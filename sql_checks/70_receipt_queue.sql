-- Receipts sealed in the recall, chained in batches (0040): the queue is forced-RLS, written
-- only by the receipts' trigger, read by auditors and the verifier, drained by chain_receipts;
-- an evidence item may leave its version out (pinned by the seal), a given one is checked.
begin;
select plan(17);

select tests.make_tenant('t-rq-1', array['team', 'exec']);
select tests.make_tenant('t-rq-2', array['team']);
select tests.make_document('t-rq-1', 'a.md', array['team'], 'alpha');
select set_config('tests.secret', tests.make_document('t-rq-1', 'secret.md', array['exec'], 'secret')::text, false);
select tests.make_document('t-rq-2', 'b.md', array['team'], 'beta');

select ok((select relrowsecurity and relforcerowsecurity from pg_class
            where oid = 'provenance.receipt_queue'::regclass), 'the queue has forced RLS');

select tests.act_as('t-rq-1', 'alice', array['team'], array['team']);
select lives_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                  select sha256('q'), jsonb_build_array(jsonb_build_object('table', 'sources.documents',
                         'row_id', jsonb_build_object('id', d.id))), sha256('r')
                    from sources.documents d where d.path = 'a.md'$$,
                'seal allow: an item without a version is pinned at its version now');
select is((select r.evidence -> 0 ->> 'version' from provenance.receipts r),
          (select encode(provenance.row_version('sources.documents', jsonb_build_object('id', d.id)), 'hex')
             from sources.documents d where d.path = 'a.md'),
          'the pinned version is the row''s current version');
select throws_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                   select sha256('q'), jsonb_build_array(jsonb_build_object('table', 'sources.documents',
                          'row_id', jsonb_build_object('id', current_setting('tests.secret')))),
                          sha256('r')$$,
                 '23503', null, 'seal deny: a row the asker cannot see, version left out');
select throws_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                   select sha256('q'), jsonb_build_array(jsonb_build_object('table', 'sources.documents',
                          'row_id', jsonb_build_object('id', d.id), 'version', repeat('0', 64))), sha256('r')
                     from sources.documents d where d.path = 'a.md'$$,
                 '23514', null, 'seal deny: a given version that is not the current one');
select throws_ok($$select count(*) from provenance.receipt_queue$$, '42501', null,
                 'queue deny: the app reads no queue');
select throws_ok($$delete from provenance.receipt_queue$$, '42501', null,
                 'queue deny: the app cannot drop a queued event');
select set_config('engram.activity_id', '00000000-0000-0000-0000-000000000001', true);
select throws_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                   values (sha256('q'), '[]', sha256('r'))$$, '22023', null,
                 'queue deny: a receipt cannot name an activity that does not exist');
select set_config('engram.activity_id', '', true);
reset role;

select is((select count(*)::int from provenance.receipt_queue q where q.tenant_id = tests.tenant('t-rq-1')),
          1, 'the receipt''s chain event is queued, not chained');
select is((select count(*)::int from provenance.events e where e.tenant_id = tests.tenant('t-rq-1')
             and e.table_name = 'provenance.receipts'), 0, 'nothing about it is on the chain yet');
select is_empty($$select * from provenance.verify_rows(tests.tenant('t-rq-1'))
                   where table_name = 'provenance.receipts'$$,
                'verify_rows: a queued receipt is not a row without a chain event');

set local role engram_auditor;
select is((select count(*)::int from provenance.receipt_queue), 1, 'queue allow: the auditor reads it');
reset role;

select tests.act_as('t-rq-2', 'bob', array['team'], array['team']);
select throws_ok($$select provenance.chain_receipts(0)$$, '22023', null,
                 'chain_receipts deny: the limit must be positive');
select is(provenance.chain_receipts(10), 1,
          'chain_receipts allow: any app session chains what is queued, of every tenant');
reset role;

select is((select count(*)::int from provenance.receipt_queue), 0, 'the chained event left the queue');
select ok((select bool_and(ok) from provenance.verify_chain(tests.tenant('t-rq-1')))
          and (select r.receipt_hash = provenance.receipt_hash(r.tenant_id, r.id, r.asked_by, r.asked_at,
                                                                r.question_hash, r.evidence, r.rendered_hash)
                 from provenance.receipts r where r.tenant_id = tests.tenant('t-rq-1')),
          'the chain verifies and the seal holds');
select is((select e.row_hash from provenance.events e where e.tenant_id = tests.tenant('t-rq-1')
             and e.table_name = 'provenance.receipts'),
          (select provenance.audit_row_version('provenance.receipts', jsonb_build_object('id', r.id), r.tenant_id)
             from provenance.receipts r where r.tenant_id = tests.tenant('t-rq-1')),
          'the chained event carries the receipt row''s version');

select * from finish();
rollback;
