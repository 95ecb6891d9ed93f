-- Shared helpers for the pgTAP files: act as a tenant user, a DBA, or nobody,
-- and build fixtures as the superuser that runs the suite. Installed once into
-- the test database (schema tests) by tests/support/pgtap.py.
create schema if not exists tests;
grant usage on schema tests to public;

create or replace function tests.act_as(p_org text, p_user text, p_read text[], p_write text[])
    returns void language plpgsql as $$
begin
    perform set_config('role', 'engram_app', true);
    perform auth.bind_identity(p_org, p_user, p_read, p_write);
end $$;
comment on function tests.act_as(text, text, text[], text[]) is
    'Become engram_app for the rest of the transaction with a bound identity.';

create or replace function tests.act_as_nobody() returns void language plpgsql as $$
begin
    -- Forget any identity bound earlier in this transaction.
    perform set_config('engram.' || k, '', true)
       from unnest(array['tenant_id', 'org_id', 'user_id', 'read_scopes', 'write_scopes']) as k;
    perform set_config('role', 'engram_app', true);
end $$;
comment on function tests.act_as_nobody() is 'Become engram_app with no identity bound.';

create or replace function tests.act_as_dba() returns void language plpgsql as $$
begin
    perform set_config('role', 'engram_dba', true);
end $$;

create or replace function tests.make_tenant(p_org text, p_scopes text[]) returns uuid
    language plpgsql as $$
declare
    v_tenant uuid;
    v_scope text;
begin
    insert into auth.tenants (org_id, name) values (p_org, p_org) returning id into v_tenant;
    foreach v_scope in array p_scopes loop
        insert into auth.scopes (tenant_id, name, description)
        values (v_tenant, v_scope, 'The ' || v_scope || ' scope');
    end loop;
    return v_tenant;
end $$;

create or replace function tests.tenant(p_org text) returns uuid language sql as $$
    select id from auth.tenants where org_id = p_org
$$;

create or replace function tests.scope(p_org text, p_scope text) returns uuid language sql as $$
    select s.id from auth.scopes s join auth.tenants t on t.id = s.tenant_id
     where t.org_id = p_org and s.name = p_scope
$$;

create or replace function tests.scopes(p_org text, p_scopes text[]) returns uuid[] language sql as $$
    select array_agg(tests.scope(p_org, n)) from unnest(p_scopes) as n
$$;

create or replace function tests.make_document(p_org text, p_path text, p_scopes text[],
                                               p_body text default 'body')
    returns uuid language plpgsql as $$
declare
    v_doc uuid;
begin
    insert into sources.documents (tenant_id, collection, path, title, body, scopes, author)
    values (tests.tenant(p_org), 'notes', p_path, p_path, p_body, tests.scopes(p_org, p_scopes),
            'fixture')
    returning id into v_doc;
    insert into sources.chunks (tenant_id, document_id, ordinal, text, char_start, char_end)
    values (tests.tenant(p_org), v_doc, 0, p_body, 0, length(p_body));
    return v_doc;
end $$;
