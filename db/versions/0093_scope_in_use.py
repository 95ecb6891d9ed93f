"""A scope that still holds rows cannot be deleted.

Why: ``engram_dba`` may delete scopes (0001), and a row names its scopes by id in an array
(no foreign key can hold an array's elements). Deleting a scope that rows are shared into
left them in place with an id no scope has: a token can name only scopes that exist, so the
rows were readable by no one from then on, and creating a scope of the same name again made
a new id that did not bring them back. A DBA tidying scopes in psql, or with ``engram admin
delete-scope``, could hide a team's whole memory in one statement without being told.

What changes:

* ``auth.scope_holders(tenant, scope)`` names the tables whose rows of ``tenant`` are
  shared into ``scope`` (nothing else: no ids, no counts, no text). It is SECURITY DEFINER
  as ``engram_verifier``, the role that already owns the functions that read memory rows
  (0006) through its select policies on every chained table; it looks at each chained table
  with a ``scopes`` column, as the catalog lists them when it runs, so a table added later
  is covered. ``engram_dba`` may call it.
* A ``before delete`` trigger on ``auth.scopes`` refuses (SQLSTATE 55006, object in use) to
  delete a scope ``scope_holders`` finds rows for, naming the scope, its tenant and the
  tables. A tenant being deleted takes its rows with it (every tenant table's foreign key
  cascades), so the scopes its deletion cascades to are not checked.

Limit: the check reads what is committed. A write into the scope that commits while the
delete runs can still land; delete a scope while nothing writes into it.

Revision ID: 0093_scope_in_use
Revises: 0092_client_connection_check
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0093_scope_in_use"
down_revision = "0092_client_connection_check"
branch_labels = None
depends_on = None

HOLDERS_SQL = r"""
create function auth.scope_holders(p_tenant uuid, p_scope uuid) returns text[]
    language plpgsql stable security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_table regclass;
    v_found boolean;
    v_holders text[] := array[]::text[];
begin
    for v_table in
        select c.t from provenance.chained_tables() as c(t)
         where exists (select 1 from pg_attribute a
                        where a.attrelid = c.t and a.attname = 'scopes' and not a.attisdropped)
         order by c.t::text
    loop
        execute format('select exists (select 1 from %s where tenant_id = $1 and scopes @> array[$2])',
                       v_table)
           into v_found using p_tenant, p_scope;
        if v_found then
            v_holders := v_holders || v_table::text;
        end if;
    end loop;
    return v_holders;
end
$$;
comment on function auth.scope_holders(uuid, uuid) is
    'The tables holding rows of the tenant shared into the scope (names only); for DBAs.';
revoke all on function auth.scope_holders(uuid, uuid) from public;
grant execute on function auth.scope_holders(uuid, uuid) to engram_dba;
"""

GUARD_SQL = r"""
create function auth.tg_scopes__refuse_in_use() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_org text;
    v_holders text[];
begin
    select t.org_id into v_org from auth.tenants t where t.id = old.tenant_id;
    if not found then
        return old;  -- the tenant is being deleted: its rows go with it
    end if;
    v_holders := auth.scope_holders(old.tenant_id, old.id);
    if cardinality(v_holders) > 0 then
        raise exception 'scope % of organization % still holds rows (in %): deleting it would leave them readable by no one; have their writers delete them or share them into another scope first',
                quote_literal(old.name), quote_literal(v_org), array_to_string(v_holders, ', ')
            using errcode = '55006';
    end if;
    return old;
end
$$;
comment on function auth.tg_scopes__refuse_in_use() is
    'Refuses to delete a scope that rows are still shared into (they would be readable by no one).';
create trigger scopes__refuse_in_use before delete on auth.scopes
    for each row execute function auth.tg_scopes__refuse_in_use();
"""


def upgrade() -> None:
    op.execute("grant create on schema auth to engram_verifier")
    op.execute(HOLDERS_SQL)
    op.execute("alter function auth.scope_holders(uuid, uuid) owner to engram_verifier")
    op.execute("revoke create on schema auth from engram_verifier")
    if op.get_bind().execute(sa.text(
            "select exists (select 1 from pg_extension where extname = 'citus')")).scalar():
        # auth.scopes is distributed (0071): Citus creates a trigger on its shards only when
        # told to, as 0071 does for the others (the trigger reads its own tenant's rows).
        op.execute("reset role")
        op.execute("set local citus.enable_unsafe_triggers = on")
        op.execute("set role engram_owner")
    op.execute(GUARD_SQL)


def downgrade() -> None:
    op.execute("drop trigger scopes__refuse_in_use on auth.scopes")
    op.execute("drop function auth.tg_scopes__refuse_in_use()")
    op.execute("drop function auth.scope_holders(uuid, uuid)")
