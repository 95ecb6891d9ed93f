-- The application's access to agents, activities, derivations and receipts:
-- its own tenant only, column-listed writes, allow and deny for each policy.
begin;
-- Chain at the end of each statement, not at commit (these transactions roll back).
set constraints all immediate;
select plan(18);

select tests.make_tenant('t-prov-p1', array['team', 'exec']);
select tests.make_tenant('t-prov-p2', array['team']);
select tests.make_document('t-prov-p1', 'a.md', array['team'], 'alpha');
select tests.make_document('t-prov-p1', 'secret.md', array['exec'], 'secret');
select tests.make_document('t-prov-p2', 'b.md', array['team'], 'beta');

select tests.act_as('t-prov-p1', 'alice', array['team'], array['team']);
select lives_ok($$insert into provenance.agents (kind, name, version) values ('model', 'm', '1')$$,
                'agents insert allow: own tenant [policy agents__insert_app allow]');
select throws_ok($$insert into provenance.agents (tenant_id, kind, name) values (tests.tenant('t-prov-p2'), 'person', 'x')$$,
                 '42501', null, 'agents insert deny: the app cannot choose the tenant [policy agents__insert_app deny]');
select isnt(provenance.begin_activity('ingest.run', '{"n": 1}'), null, 'activities insert allow: begin_activity [policy activities__insert_app allow]');
select is((select actor_user || '/' || actor_role from provenance.activities where kind = 'ingest.run'),
          'alice/engram_app', 'the activity is stamped with the user and role, not the caller''s say');
select throws_ok($$update provenance.activities set kind = 'x'$$, '42501', null,
                 'activities update deny: only ended_at is writable');
select lives_ok($$select provenance.end_activity()$$, 'activities update allow: ending one''s activity [policy activities__update_app allow]');
select set_config('engram.activity_id', '00000000-0000-0000-0000-000000000001', true);
select throws_ok($$update sources.documents set title = 'x' where path = 'a.md'$$, '22023', null,
                 'a write cannot name an activity that does not exist');
select set_config('engram.activity_id', '', true);
select lives_ok($$insert into provenance.derivations (derived_table, derived_row_id, source_table, source_row_id)
                  select 'sources.chunks', jsonb_build_object('id', c.id), 'sources.documents',
                         jsonb_build_object('id', c.document_id) from sources.chunks c limit 1$$,
                'derivations insert allow: visible rows of the own tenant [policy derivations__insert_app allow]');
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, source_table, source_row_id)
                   select 'sources.documents', jsonb_build_object('id', d.id), 'sources.documents',
                          jsonb_build_object('id', d.id) from sources.documents d limit 1$$ ||
                 $$ union all select 'sources.documents', '{"id": "00000000-0000-0000-0000-000000000000"}', null, null$$,
                 null, null, 'derivations insert deny: a row that does not exist [policy derivations__insert_app deny]');
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                        source_table, source_row_id)
                   select 'sources.documents', jsonb_build_object('id', d.id), '\x00', 'sources.documents',
                          jsonb_build_object('id', d.id) from sources.documents d limit 1$$, '23514', null,
                 'derivations insert deny: a written version must be the row''s current version');
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, recorded_by, source_agent_id)
                   values ('sources.documents', '{}', 'mallory', null)$$, '42501', null,
                 'derivations insert deny: who recorded an edge is stamped, not written');
select is((select count(*)::int from provenance.derivations), 1, 'derivations select allow: own rows');
select lives_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                  select sha256('q'), jsonb_build_array(jsonb_build_object('table', 'sources.documents',
                         'row_id', jsonb_build_object('id', d.id),
                         'version', encode(provenance.row_version('sources.documents', jsonb_build_object('id', d.id)), 'hex'))),
                         sha256('r') from sources.documents d where d.path = 'a.md'$$,
                'receipts insert allow: evidence at its current version [policy receipts__insert_app allow]');
select throws_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash, receipt_hash)
                   values (sha256('q'), '[]', sha256('r'), sha256('forged'))$$, '42501', null,
                 'receipts insert deny: the seal is computed, not written [policy receipts__insert_app deny]');
reset role;

select tests.act_as('t-prov-p1', 'alice', array['team'], array['team']);
select is(provenance.row_version('sources.documents',
             (select jsonb_build_object('id', id) from sources.documents where path = 'a.md')) is not null,
          true, 'row_version allow: a visible row');
reset role;
select set_config('tests.secret', (select id::text from sources.documents
                                   where path = 'secret.md' and tenant_id = tests.tenant('t-prov-p1')), true);
select tests.act_as('t-prov-p1', 'alice', array['team'], array['team']);
select is(provenance.row_version('sources.documents', jsonb_build_object('id', current_setting('tests.secret'))),
          null, 'row_version deny: a row in a scope the caller cannot read has no version for it');
reset role;

select tests.act_as('t-prov-p2', 'bob', array['team'], array['team']);
select is_empty('select 1 from provenance.activities union all select 1 from provenance.derivations '
                'union all select 1 from provenance.receipts union all select 1 from provenance.agents',
                'select deny: another tenant''s provenance is invisible to the app');
select is_empty($$update provenance.activities set ended_at = now() returning 1$$,
                'update deny: another tenant''s activities are untouchable [policy activities__update_app deny]');
reset role;

select * from finish();
rollback;
