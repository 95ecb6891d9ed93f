-- A receipt pins its served rows' versions with one planned query (0082_receipt_seal_static):
-- provenance.served_row_versions gives exactly row_versions's versions, sees only what RLS
-- lets the caller see, and the seal refuses and pins exactly as before, whichever way a
-- table is spelt (as stored, in capitals, quoted: since 0085_receipt_seal_names the
-- canonical name is read from the catalog cache, and must stay table_name's) and whichever
-- path (served tables, another chained table) a row takes.
begin;
\ir helpers_knowledge.sql
select plan(13);

select tests.make_tenant('t-ss-1', array['team', 'exec']);
select tests.make_tenant('t-ss-2', array['team']);
select set_config('tests.doc', tests.make_document('t-ss-1', 'a.md', array['team'], 'alpha words')::text, true);
select set_config('tests.secret', tests.make_document('t-ss-1', 's.md', array['exec'], 'secret')::text, true);
select set_config('tests.other', tests.make_document('t-ss-2', 'b.md', array['team'], 'beta')::text, true);
select set_config('tests.entity', tests.k_entity('t-ss-1', 'person', 'Ann Lee', array['team'])::text, true);

select has_function('provenance', 'served_row_versions', array['jsonb', 'uuid'],
                    'served_row_versions exists');
select is((select has_function_privilege('engram_app', 'provenance.served_row_versions(jsonb, uuid)',
                                         'execute')), true, 'the app may run it (the seal runs as the app)');

select tests.act_as('t-ss-1', 'alice', array['team'], array['team']);
select set_config('tests.claim', tests.k_claim(current_setting('tests.entity')::uuid, 'works_at',
                  'Acme', tests.scopes('t-ss-1', array['team']))::text, true);
select set_config('tests.ids', jsonb_build_object(
    'sources.documents', jsonb_build_array(current_setting('tests.doc')),
    'sources.chunks', (select jsonb_agg(c.id) from sources.chunks c
                        where c.document_id = current_setting('tests.doc')::uuid),
    'knowledge.entities', jsonb_build_array(current_setting('tests.entity')),
    'knowledge.fact_claim', jsonb_build_array(current_setting('tests.claim')))::text, true);

select results_eq(
    $$select table_name, id, version from provenance.served_row_versions(
          current_setting('tests.ids')::jsonb, auth.tenant_id()) order by 1, 2$$,
    $$select t, v.id, v.version from (values ('knowledge.entities'), ('knowledge.fact_claim'),
                                             ('sources.chunks'), ('sources.documents')) as n(t)
        cross join lateral provenance.row_versions(n.t::regclass, array(
            select jsonb_array_elements_text(current_setting('tests.ids')::jsonb -> n.t)::uuid)) as v
       order by 1, 2$$,
    'allow: the same versions as row_versions, table by table');
select is((select count(*)::int from provenance.served_row_versions(
               current_setting('tests.ids')::jsonb, auth.tenant_id())), 4,
          'one version per named row (a document, its chunk, an entity, a claim)');
select is_empty($$select * from provenance.served_row_versions(jsonb_build_object(
                      'sources.documents', jsonb_build_array(current_setting('tests.secret'))),
                      auth.tenant_id())$$,
                'deny: a row of a scope the caller cannot read has no version');
select is_empty($$select * from provenance.served_row_versions(jsonb_build_object(
                      'sources.documents', jsonb_build_array(current_setting('tests.other'))),
                      tests.tenant('t-ss-2'))$$,
                'deny: another tenant''s row has none, even named with that tenant');

-- The seal: two spellings of one served table, and a chained table outside the served set
-- (knowledge.fact_content, through row_versions), in one receipt.
select lives_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                  select sha256('q'), jsonb_build_array(
                      jsonb_build_object('table', 'sources.documents', 'row_id',
                                         jsonb_build_object('id', current_setting('tests.doc'))),
                      jsonb_build_object('table', 'SOURCES.Documents', 'row_id',
                                         jsonb_build_object('id', current_setting('tests.doc'))),
                      jsonb_build_object('table', '"sources"."documents"', 'row_id',
                                         jsonb_build_object('id', current_setting('tests.doc'))),
                      jsonb_build_object('table', 'knowledge.fact_claim', 'row_id',
                                         jsonb_build_object('id', current_setting('tests.claim'))),
                      jsonb_build_object('table', 'knowledge.fact_content', 'row_id',
                                         jsonb_build_object('id', c.content_id))), sha256('r')
                    from knowledge.fact_claim c where c.id = current_setting('tests.claim')::uuid$$,
                'seal allow: served tables (three spellings) and another chained table in one receipt');
select results_eq(
    $$select e ->> 'table', e ->> 'version' from provenance.receipts r,
             jsonb_array_elements(r.evidence) with ordinality as x(e, n) order by n$$,
    $$values ('sources.documents', encode(provenance.row_version('sources.documents',
                  jsonb_build_object('id', current_setting('tests.doc'))), 'hex')),
             ('sources.documents', encode(provenance.row_version('sources.documents',
                  jsonb_build_object('id', current_setting('tests.doc'))), 'hex')),
             ('sources.documents', encode(provenance.row_version('sources.documents',
                  jsonb_build_object('id', current_setting('tests.doc'))), 'hex')),
             ('knowledge.fact_claim', encode(provenance.row_version('knowledge.fact_claim',
                  jsonb_build_object('id', current_setting('tests.claim'))), 'hex')),
             ('knowledge.fact_content', encode(provenance.row_version('knowledge.fact_content',
                  jsonb_build_object('id', (select content_id from knowledge.fact_claim
                                             where id = current_setting('tests.claim')::uuid))), 'hex'))$$,
    'each item is pinned at its current version, under its canonical table name');
select is((select receipt_hash = provenance.receipt_hash(tenant_id, id, asked_by, asked_at, question_hash,
                                                        evidence, rendered_hash) from provenance.receipts),
          true, 'the receipt is sealed over what it stores');
select throws_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                   select sha256('q'), jsonb_build_array(jsonb_build_object('table', 'sources.documents',
                          'row_id', jsonb_build_object('id', current_setting('tests.secret')))),
                          sha256('r')$$,
                 '23503', null, 'seal deny: a served table''s row the asker cannot see');
select throws_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                   select sha256('q'), jsonb_build_array(jsonb_build_object('table', 'sources.documents',
                          'row_id', jsonb_build_object('id', current_setting('tests.other')))),
                          sha256('r')$$,
                 '23503', null, 'seal deny: another tenant''s row');
select throws_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                   select sha256('q'), jsonb_build_array(jsonb_build_object('table', 'sources.chunks',
                          'row_id', jsonb_build_object('id', c.id), 'version', repeat('0', 64))),
                          sha256('r')
                     from sources.chunks c where c.document_id = current_setting('tests.doc')::uuid$$,
                 '23514', null, 'seal deny: a given version that is not the current one');
select throws_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                   values (sha256('q'), jsonb_build_array(jsonb_build_object('table', '"Sources".documents',
                           'row_id', jsonb_build_object('id', current_setting('tests.doc')))), sha256('r'))$$,
                 '22023', 'evidence names an unknown table "Sources".documents',
                 'seal deny: a quoted spelling of no table is refused by name');
reset role;

select * from finish();
rollback;
