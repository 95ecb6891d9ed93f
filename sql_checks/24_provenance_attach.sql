-- provenance.attach_chain on a new table, BASELINE events for rows that
-- existed before, a row written behind the chain's back, and writers other
-- than the app (the embedding worker) on the chain.
begin;
-- Chain at the end of each statement, not at commit (these transactions roll back).
set constraints all immediate;
select plan(13);

select tests.make_tenant('t-prov-at', array['team']);
select tests.make_document('t-prov-at', 'a.md', array['team'], 'alpha words');

create table sources.tmp_chain_probe (tenant_id uuid not null, id integer not null, note text,
                                      primary key (tenant_id, id));
insert into sources.tmp_chain_probe values (tests.tenant('t-prov-at'), 1, 'one'), (tests.tenant('t-prov-at'), 2, 'two');

select is(provenance.baseline('sources.tmp_chain_probe'), 2::bigint, 'baseline: one event per existing row');
select lives_ok($$select provenance.attach_chain('sources.tmp_chain_probe')$$, 'attach_chain on a new table');
select is((select array_agg(operation order by seq) from provenance.events
            where tenant_id = tests.tenant('t-prov-at') and table_name = 'sources.tmp_chain_probe'),
          array['BASELINE', 'BASELINE'], 'the existing rows are in the chain as BASELINE');

insert into sources.tmp_chain_probe values (tests.tenant('t-prov-at'), 3, 'three');
update sources.tmp_chain_probe set note = 'uno' where id = 1;
delete from sources.tmp_chain_probe where id = 2;
select is((select array_agg(operation || ':' || (row_id ->> 'id') order by seq) from provenance.events
            where tenant_id = tests.tenant('t-prov-at') and table_name = 'sources.tmp_chain_probe'),
          array['BASELINE:1', 'BASELINE:2', 'INSERT:3', 'UPDATE:1', 'DELETE:2'],
          'insert, update and delete each append an event with the row id');
select ok((select bool_and(ok) from provenance.verify_chain(tests.tenant('t-prov-at'))), 'the chain verifies');
select is_empty($$select * from provenance.verify_rows(tests.tenant('t-prov-at'))$$,
                'every current row matches its latest event');

set local session_replication_role = replica;
insert into sources.tmp_chain_probe values (tests.tenant('t-prov-at'), 4, 'smuggled');
reset session_replication_role;
select results_eq($$select table_name, row_id ->> 'id', problem from provenance.verify_rows(tests.tenant('t-prov-at'))$$,
                  $$values ('sources.tmp_chain_probe', '4', 'row has no chain event')$$,
                  'a row inserted with the triggers off is reported by key');

select throws_ok($$select provenance.attach_chain('engram.installation')$$, '42P16', null,
                 'attach_chain refuses a table without tenant_id');
select throws_ok($$select provenance.attach_chain('provenance.events')$$, '42P16', null,
                 'the chain cannot chain itself');
select throws_ok($$select provenance.attach_chain('sources.tmp_chain_probe')$$, '42710', null,
                 'attaching twice is refused (the triggers exist)');

-- the embedding worker writes vectors; its writes are chained with its role and no user
select set_config('tests.at_tenant', tests.tenant('t-prov-at')::text, true);
set local role engram_worker;
select lives_ok($$update sources.chunks set embedding = array_fill(0.5, array[384])::vector, embed_state = 'ready',
                  embed_model = 'm' where tenant_id = current_setting('tests.at_tenant')::uuid$$,
                'worker: writes an embedding');
reset role;
select is((select actor_role || '/' || coalesce(actor_user, 'none') from provenance.events
            where tenant_id = tests.tenant('t-prov-at') and table_name = 'sources.chunks' order by seq desc limit 1),
          'engram_worker/none', 'the worker''s write is in the chain under its own role');
select ok((select bool_and(ok) from provenance.verify_chain(tests.tenant('t-prov-at'))),
          'the chain still verifies (vectors hash canonically)');

select * from finish();
rollback;
