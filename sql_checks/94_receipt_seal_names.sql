-- A receipt's seal names each table from the catalog cache (0085_receipt_seal_names): every
-- spelling of a table (as stored, in capitals, quoted) is sealed under the same canonical
-- name table_name gives, and a table named outside the served path still goes through
-- table_name; what the seal refuses is refused as before.
begin;
\ir helpers_knowledge.sql
select plan(5);

select tests.make_tenant('t-sn-1', array['team']);
select set_config('tests.doc', tests.make_document('t-sn-1', 'a.md', array['team'], 'alpha words')::text, true);
select set_config('tests.entity', tests.k_entity('t-sn-1', 'person', 'Ann Lee', array['team'])::text, true);

select tests.act_as('t-sn-1', 'alice', array['team'], array['team']);
select set_config('tests.claim', tests.k_claim(current_setting('tests.entity')::uuid, 'works_at',
                  'Acme', tests.scopes('t-sn-1', array['team']))::text, true);

select lives_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                  select sha256('q'), jsonb_build_array(
                      jsonb_build_object('table', 'sources.documents', 'row_id',
                                         jsonb_build_object('id', current_setting('tests.doc'))),
                      jsonb_build_object('table', 'SOURCES.DOCUMENTS', 'row_id',
                                         jsonb_build_object('id', current_setting('tests.doc'))),
                      jsonb_build_object('table', '"sources"."documents"', 'row_id',
                                         jsonb_build_object('id', current_setting('tests.doc'))),
                      jsonb_build_object('table', 'knowledge."fact_content"', 'row_id',
                                         jsonb_build_object('id', c.content_id))), sha256('r')
                    from knowledge.fact_claim c where c.id = current_setting('tests.claim')::uuid$$,
                'seal allow: one table in three spellings, and a chained table outside the served set');
select results_eq(
    $$select e ->> 'table' from provenance.receipts r,
             jsonb_array_elements(r.evidence) with ordinality as x(e, n) order by n$$,
    $$values ('sources.documents'), ('sources.documents'), ('sources.documents'),
             ('knowledge.fact_content')$$,
    'every spelling is sealed under the name table_name gives');
select is((select count(distinct e ->> 'version')::int from provenance.receipts r,
                  jsonb_array_elements(r.evidence) as e where e ->> 'table' = 'sources.documents'),
          1, 'the three spellings pin one version');
select is((select e ->> 'table' from provenance.receipts r, jsonb_array_elements(r.evidence) as e
            where e ->> 'table' = provenance.table_name('knowledge.fact_content')),
          'knowledge.fact_content', 'the canonical name is table_name''s, read from the catalog cache');
select throws_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                   values (sha256('q'), jsonb_build_array(jsonb_build_object('table', '"Sources".documents',
                           'row_id', jsonb_build_object('id', current_setting('tests.doc')))), sha256('r'))$$,
                 '22023', 'evidence names an unknown table "Sources".documents',
                 'seal deny: a quoted spelling of no table is refused by name, as before');
reset role;

select * from finish();
rollback;
