-- engram_auditor reads the provenance of every tenant and nothing else: no
-- memory table, no write anywhere. It learns rows' hashes only through the
-- verifier's functions.
begin;
-- Chain at the end of each statement, not at commit (these transactions roll back).
set constraints all immediate;
select plan(16);

select tests.make_tenant('t-prov-au1', array['team']);
select tests.make_tenant('t-prov-au2', array['team']);
select tests.make_document('t-prov-au1', 'a.md', array['team'], 'alpha');
select tests.make_document('t-prov-au2', 'b.md', array['team'], 'beta');

select ok((select rolcanlogin and not rolsuper and not rolbypassrls from pg_roles where rolname = 'engram_auditor'),
          'engram_auditor logs in and cannot bypass RLS');
select ok((select not rolcanlogin and not rolsuper and not rolbypassrls from pg_roles where rolname = 'engram_verifier'),
          'engram_verifier cannot log in');

set local role engram_auditor;
select is((select count(distinct tenant_id)::int from provenance.events
            where tenant_id in (tests.tenant('t-prov-au1'), tests.tenant('t-prov-au2'))), 2,
          'auditor: reads the chain of every tenant');
select ok((select count(*) from provenance.agents) >= 0 and (select count(*) from provenance.receipts) >= 0,
          'auditor: reads agents and receipts');
select throws_ok('select count(*) from sources.documents', '42501', null, 'auditor: cannot read documents');
select throws_ok('select count(*) from sources.chunks', '42501', null, 'auditor: cannot read chunks');
select throws_ok('select count(*) from auth.scopes', '42501', null, 'auditor: cannot read scopes');
select throws_ok($$insert into sources.documents (collection, path, title, body, scopes) values ('n', 'x', 'x', 'x', '{}')$$,
                 '42501', null, 'auditor: cannot write documents');
select throws_ok($$insert into provenance.agents (tenant_id, kind, name) values (tests.tenant('t-prov-au1'), 'person', 'x')$$,
                 '42501', null, 'auditor: cannot write agents');
select throws_ok($$select provenance.begin_activity('audit')$$, null, null, 'auditor: cannot start activities');
select ok((select bool_and(ok) and count(*) = 2 from provenance.verify_chain() v
            where v.tenant_id in (tests.tenant('t-prov-au1'), tests.tenant('t-prov-au2'))),
          'auditor: verifies every tenant''s chain');
select is_empty($$select * from provenance.verify_rows(tests.tenant('t-prov-au1'))$$,
                'auditor: compares current rows with the chain (keys and hashes only)');
select is(provenance.audit_row_version('sources.documents',
              (select row_id from provenance.events where tenant_id = tests.tenant('t-prov-au1')
                  and table_name = 'sources.documents' limit 1), tests.tenant('t-prov-au1')),
          (select row_hash from provenance.events where tenant_id = tests.tenant('t-prov-au1')
              and table_name = 'sources.documents' limit 1),
          'auditor: gets the current version hash of a row it cannot read');
select throws_ok($$select provenance.attach_chain('sources.documents')$$, '42501', null,
                 'auditor: cannot attach chains');
reset role;

-- the verifier's reach is its functions: its policies let it read rows, and it cannot log in to use them
select tests.act_as('t-prov-au1', 'alice', array['team'], array['team']);
select throws_ok($$select * from provenance.verify_rows()$$, '42501', null,
                 'app: cannot call the verifier''s row check');
select throws_ok($$select provenance.audit_row_version('sources.documents', '{"id": "x"}', tests.tenant('t-prov-au2'))$$,
                 '42501', null, 'app: cannot ask for another tenant''s row versions');
reset role;

select * from finish();
rollback;
