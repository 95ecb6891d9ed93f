"""Roles, the auth schema, tenants, scopes and identity binding.

Why: every later table's row-level security reads the caller's identity from
per-transaction settings that only ``auth.bind_identity`` writes. Roles are
cluster-wide objects, so they are created if missing and left in place on
downgrade (other databases of the cluster may still use them).

Roles:
* ``engram_owner``   NOLOGIN; owns every Engram schema and object. Migrations
  run as this role (``db/env.py`` switches to it once it exists).
* ``engram_app``     LOGIN, NOBYPASSRLS, owns nothing; column-listed grants.
* ``engram_auditor`` LOGIN, read-only; reads the provenance chain (later).
* ``engram_dba``     NOLOGIN group role for scope administration; grant it to
  the people who manage tenants and scopes.

Revision ID: 0001_roles_and_auth
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001_roles_and_auth"
down_revision = None
branch_labels = None
depends_on = None

ROLES_SQL = """
do $roles$
begin
    if not exists (select 1 from pg_roles where rolname = 'engram_owner') then
        create role engram_owner nologin noinherit;
    end if;
    if not exists (select 1 from pg_roles where rolname = 'engram_app') then
        create role engram_app login nobypassrls nocreatedb nocreaterole noinherit;
    end if;
    if not exists (select 1 from pg_roles where rolname = 'engram_auditor') then
        create role engram_auditor login nobypassrls nocreatedb nocreaterole noinherit;
    end if;
    if not exists (select 1 from pg_roles where rolname = 'engram_dba') then
        create role engram_dba nologin nobypassrls nocreatedb nocreaterole;
    end if;
end
$roles$;
comment on role engram_owner is 'Owns Engram''s schemas and objects; migrations run as it.';
comment on role engram_app is 'The application: LOGIN, no BYPASSRLS, owns nothing.';
comment on role engram_auditor is 'Read-only auditor: reads provenance, writes nothing.';
comment on role engram_dba is 'Administers tenants and scopes through auth functions.';
"""

FUNCTIONS_SQL = r"""
create function auth.tenant_id() returns uuid
    language sql stable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$ select nullif(current_setting('engram.tenant_id', true), '')::uuid $$;
comment on function auth.tenant_id() is
    'The tenant bound to this transaction by auth.bind_identity, or null.';

create function auth.user_id() returns text
    language sql stable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$ select nullif(current_setting('engram.user_id', true), '') $$;
comment on function auth.user_id() is 'The user bound to this transaction, or null.';

create function auth.write_scopes() returns uuid[]
    language sql stable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$ select coalesce(nullif(current_setting('engram.write_scopes', true), '')::uuid[], '{}') $$;
comment on function auth.write_scopes() is
    'Ids of the scopes the bound identity may write (write implies read).';

create function auth.read_scopes() returns uuid[]
    language sql stable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select coalesce(nullif(current_setting('engram.read_scopes', true), '')::uuid[], '{}')
           || auth.write_scopes()
$$;
comment on function auth.read_scopes() is
    'Ids of the scopes the bound identity may read: its read scopes and its write scopes.';

create function auth.bind_identity(
    p_org_id text, p_user_id text, p_read_scopes text[], p_write_scopes text[]
) returns uuid
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid;
    v_unknown text[];
    v_read uuid[];
    v_write uuid[];
begin
    if p_org_id is null or p_org_id = '' then
        raise exception 'no tenant (organization) given' using errcode = '28000';
    end if;
    if p_user_id is null or p_user_id = '' then
        raise exception 'no user given' using errcode = '28000';
    end if;
    -- Clear any earlier binding of this transaction first.
    perform set_config('engram.tenant_id', '', true);
    perform set_config('engram.read_scopes', '', true);
    perform set_config('engram.write_scopes', '', true);
    perform set_config('engram.org_id', p_org_id, true);
    select t.id into v_tenant from auth.tenants t where t.org_id = p_org_id;
    if v_tenant is null then
        raise exception 'unknown tenant (organization) %', quote_literal(p_org_id)
            using errcode = '28000';
    end if;
    perform set_config('engram.tenant_id', v_tenant::text, true);
    select array_agg(n order by n) into v_unknown
      from unnest(coalesce(p_read_scopes, '{}') || coalesce(p_write_scopes, '{}')) as n
     where not exists (select 1 from auth.scopes s where s.tenant_id = v_tenant and s.name = n);
    if v_unknown is not null then
        perform set_config('engram.tenant_id', '', true);
        raise exception 'unknown scope(s) for tenant %: %', quote_literal(p_org_id),
            array_to_string(v_unknown, ', ') using errcode = '42501';
    end if;
    select coalesce(array_agg(s.id order by s.id), '{}') into v_read
      from auth.scopes s where s.tenant_id = v_tenant and s.name = any(p_read_scopes);
    select coalesce(array_agg(s.id order by s.id), '{}') into v_write
      from auth.scopes s where s.tenant_id = v_tenant and s.name = any(p_write_scopes);
    perform set_config('engram.user_id', p_user_id, true);
    perform set_config('engram.read_scopes', v_read::text, true);
    perform set_config('engram.write_scopes', v_write::text, true);
    return v_tenant;
end
$$;
comment on function auth.bind_identity(text, text, text[], text[]) is
    'Binds a verified identity (organization, user, read and write scope names) to the '
    'current transaction only. Unknown tenants and scopes are refused.';

create function auth.create_tenant(p_org_id text, p_name text) returns uuid
    language sql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$ insert into auth.tenants (org_id, name) values (p_org_id, p_name) returning id $$;
comment on function auth.create_tenant(text, text) is 'DBA: create a tenant for an organization.';

create function auth.create_scope(p_tenant uuid, p_name text, p_description text) returns uuid
    language sql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
    insert into auth.scopes (tenant_id, name, description)
    values (p_tenant, p_name, coalesce(p_description, '')) returning id
$$;
comment on function auth.create_scope(uuid, text, text) is 'DBA: create a scope in a tenant.';

create function auth.check_scopes(p_tenant uuid, p_scopes uuid[]) returns uuid[]
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_unknown uuid[];
    v_sorted uuid[];
begin
    if p_scopes is null or cardinality(p_scopes) = 0 then
        raise exception 'a row must be shared into at least one scope'
            using errcode = '23514';
    end if;
    select array_agg(x order by x) into v_unknown
      from unnest(p_scopes) as x
     where not exists (select 1 from auth.scopes s where s.tenant_id = p_tenant and s.id = x);
    if v_unknown is not null then
        raise exception 'unknown scope id(s) for this tenant: %', array_to_string(v_unknown, ', ')
            using errcode = '23503';
    end if;
    select array_agg(distinct x order by x) into v_sorted from unnest(p_scopes) as x;
    return v_sorted;
end
$$;
comment on function auth.check_scopes(uuid, uuid[]) is
    'Refuses empty scope sets and scopes not of the tenant; returns the set sorted and unique.';
"""

POLICIES_SQL = """
alter table auth.tenants enable row level security;
alter table auth.tenants force row level security;
alter table auth.scopes enable row level security;
alter table auth.scopes force row level security;

create policy tenants__select_app on auth.tenants for select to engram_app
    using (id = (select auth.tenant_id())
           or org_id = nullif(current_setting('engram.org_id', true), ''));
create policy tenants__all_dba on auth.tenants for all to engram_dba
    using (true) with check (true);

create policy scopes__select_app on auth.scopes for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy scopes__all_dba on auth.scopes for all to engram_dba
    using (true) with check (true);

grant usage on schema auth to engram_app, engram_dba, engram_auditor;
grant select on auth.tenants, auth.scopes to engram_app;
grant select, delete on auth.tenants, auth.scopes to engram_dba;
grant insert (org_id, name), update (name) on auth.tenants to engram_dba;
grant insert (tenant_id, name, description), update (name, description) on auth.scopes to engram_dba;
revoke all on function auth.create_tenant(text, text), auth.create_scope(uuid, text, text) from public;
grant execute on function auth.create_tenant(text, text), auth.create_scope(uuid, text, text) to engram_dba;

comment on table auth.tenants is 'One row per tenant (a Logto organization).';
comment on table auth.scopes is 'Named scopes a tenant shares rows into; tokens grant read/write on them.';
"""


def upgrade() -> None:
    op.execute("reset role")
    op.execute(ROLES_SQL)
    op.execute(
        "do $g$ begin if not (select rolsuper from pg_roles where rolname = current_user) then "
        "execute format('grant engram_owner to %I', current_user); end if; end $g$"
    )
    op.execute(
        "do $g$ begin execute format('grant create on database %I to engram_owner', "
        "current_database()); end $g$"
    )
    op.execute("create extension if not exists vector")
    op.execute("create extension if not exists btree_gin")
    op.execute("grant all on table public.alembic_version to engram_owner")
    op.execute("create schema auth authorization engram_owner")
    op.execute("create schema engram authorization engram_owner")
    op.execute("comment on schema auth is 'Tenants, scopes and the bound identity.'")
    op.execute("comment on schema engram is 'Installation facts about this Engram database.'")
    op.execute("set role engram_owner")

    op.create_table(
        "tenants",
        sa.Column("id", postgresql.UUID(as_uuid=True), server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("org_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
        sa.UniqueConstraint("org_id", name="uq_tenants_org_id"),
        sa.CheckConstraint("length(org_id) between 1 and 200", name="ck_tenants_org_id_length"),
        sa.CheckConstraint("length(name) between 1 and 200", name="ck_tenants_name_length"),
        schema="auth",
    )
    op.create_table(
        "scopes",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_scopes"),
        sa.UniqueConstraint("tenant_id", "name", name="uq_scopes_tenant_id_name"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name="fk_scopes_tenant_id_tenants", ondelete="CASCADE"),
        sa.CheckConstraint(r"name ~ '^[a-z0-9][a-z0-9._:-]{0,62}$'", name="ck_scopes_name_format"),
        sa.CheckConstraint("length(description) <= 2000", name="ck_scopes_description_length"),
        schema="auth",
    )
    op.execute(FUNCTIONS_SQL)
    op.execute(POLICIES_SQL)


def downgrade() -> None:
    op.execute("set role engram_owner")
    op.execute("drop schema auth cascade")
    op.execute("drop schema engram cascade")
    op.execute("reset role")
    op.execute("drop extension if exists btree_gin")
    op.execute("drop extension if exists vector")
