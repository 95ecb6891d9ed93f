-- Grants are exactly what is intended.
begin;
select plan(14);

select table_privs_are('auth', 'tenants', 'engram_app', array['SELECT'], 'app: tenants read-only');
select table_privs_are('auth', 'scopes', 'engram_app', array['SELECT'], 'app: scopes read-only');
select table_privs_are('sources', 'documents', 'engram_app', array['SELECT', 'DELETE'],
                       'app: documents select/delete on the table; insert/update only on columns');
select table_privs_are('sources', 'chunks', 'engram_app', array['SELECT', 'DELETE'],
                       'app: chunks select/delete on the table; insert/update only on columns');
select table_privs_are('engram', 'installation', 'engram_app', array['SELECT'], 'app: installation read-only');
select table_privs_are('sources', 'documents', 'engram_auditor', '{}', 'auditor: no access to documents');
select table_privs_are('sources', 'chunks', 'engram_auditor', '{}', 'auditor: no access to chunks');
select table_privs_are('auth', 'scopes', 'engram_dba', array['SELECT', 'DELETE'], 'dba: scopes select/delete; insert/update on columns');
select table_privs_are('sources', 'documents', 'engram_dba', '{}', 'dba: no access to documents');

select column_privs_are('sources', 'documents', 'tenant_id', 'engram_app', array['SELECT'],
                        'app cannot write documents.tenant_id');
select column_privs_are('sources', 'documents', 'content_hash', 'engram_app', array['SELECT'],
                        'app cannot write documents.content_hash (computed by trigger)');
select column_privs_are('sources', 'chunks', 'scopes', 'engram_app', array['SELECT', 'UPDATE'],
                        'app may update chunks.scopes only for propagation (the trigger overwrites it)');
select column_privs_are('sources', 'documents', 'title', 'engram_app', array['INSERT', 'SELECT', 'UPDATE'],
                        'app may write documents.title');
select column_privs_are('sources', 'chunks', 'embedding', 'engram_app', array['SELECT', 'UPDATE'],
                        'app may write chunks.embedding (the worker), not insert it');

select * from finish();
rollback;
