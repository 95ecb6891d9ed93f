"""The identity functions every policy calls are PL/pgSQL, so each call costs half as much.

Why: every row level security policy tests ``tenant_id = (select auth.tenant_id())`` and
the reader's scopes ``(select auth.read_scopes())`` (writers ``auth.write_scopes()``,
private rows ``auth.user_id()`` and ``auth.is_service()``), and each such subquery of a
statement is its own InitPlan: the recall statement has about 120 pairs. The functions
were SQL functions with a ``SET search_path`` clause, which PostgreSQL never inlines and
runs through the SQL-function executor, whose per-call-site state (the body parsed and
planned again) is built at every call site. A PL/pgSQL function keeps its compiled body for
the connection. Measured on the kept 10k corpus (a prepared statement of 200 call sites,
as superuser, docs/recall.md): ``read_scopes`` 4.3 -> 2.3 us a call site, ``tenant_id``
2.5 -> 1.8 us.

What changes: ``auth.tenant_id``, ``auth.user_id``, ``auth.write_scopes``,
``auth.read_scopes`` and ``auth.is_service`` are replaced (same names, arguments, results,
volatility, parallel safety, search path, grants and comments) by PL/pgSQL bodies that
return exactly what the SQL bodies returned; ``read_scopes`` reads both settings itself
instead of calling ``write_scopes``. Neither kind of function is inlined, and both are
evaluated by the planner's estimates alike (a stable function is run for an estimate), so
no plan changes: only the calls get cheaper.

Revision ID: 0088_identity_functions_plpgsql
Revises: 0087_document_aliases
"""

from __future__ import annotations

from alembic import op

revision = "0088_identity_functions_plpgsql"
down_revision = "0087_document_aliases"
branch_labels = None
depends_on = None

_HEAD = ("language {lang} stable parallel safe security invoker\n"
         "    set search_path = pg_catalog, pg_temp")

PLPGSQL = {
    "auth.tenant_id() returns uuid":
        "begin return nullif(current_setting('engram.tenant_id', true), '')::uuid; end",
    "auth.user_id() returns text":
        "begin return nullif(current_setting('engram.user_id', true), ''); end",
    "auth.write_scopes() returns uuid[]":
        "begin return coalesce(nullif(current_setting('engram.write_scopes', true), '')::uuid[], "
        "'{}'); end",
    "auth.read_scopes() returns uuid[]":
        "begin return coalesce(nullif(current_setting('engram.read_scopes', true), '')::uuid[], "
        "'{}') || coalesce(nullif(current_setting('engram.write_scopes', true), '')::uuid[], "
        "'{}'); end",
    "auth.is_service() returns boolean":
        "begin return coalesce(nullif(current_setting('engram.user_id', true), '') = "
        "auth.service_user() and nullif(current_setting('engram.service_tenant', true), '') = "
        "nullif(current_setting('engram.tenant_id', true), '')::uuid::text, false); end",
}

# The SQL bodies they replace (0001 and 0011), for the downgrade.
SQL = {
    "auth.tenant_id() returns uuid":
        "select nullif(current_setting('engram.tenant_id', true), '')::uuid",
    "auth.user_id() returns text": "select nullif(current_setting('engram.user_id', true), '')",
    "auth.write_scopes() returns uuid[]":
        "select coalesce(nullif(current_setting('engram.write_scopes', true), '')::uuid[], '{}')",
    "auth.read_scopes() returns uuid[]":
        "select coalesce(nullif(current_setting('engram.read_scopes', true), '')::uuid[], '{}') "
        "|| auth.write_scopes()",
    "auth.is_service() returns boolean":
        "select coalesce(auth.user_id() = auth.service_user() and nullif(current_setting("
        "'engram.service_tenant', true), '') = auth.tenant_id()::text, false)",
}


def _replace(bodies: dict[str, str], lang: str) -> None:
    for signature, body in bodies.items():
        op.execute(f"create or replace function {signature}\n    {_HEAD.format(lang=lang)}\n"
                   f"as $fn$ {body} $fn$")


def upgrade() -> None:
    _replace(PLPGSQL, "plpgsql")


def downgrade() -> None:
    _replace(SQL, "sql")
