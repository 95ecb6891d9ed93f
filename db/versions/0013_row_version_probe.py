"""``provenance.row_version`` finds its row through the primary key, whatever the statistics.

Why: 0006 looks the row up by joining the table with
``jsonb_populate_record(null::table, row_id)``. When a table's statistics were
gathered before the current tenant had rows in it, the planner chose to scan
the tenant's whole table for that join, on every call: 16 ms per call measured
while a new tenant's RAPTOR tree recorded its derivation edges (each edge reads
two row versions), and every recall receipt reads one version per served row.
The key values are now taken from the row id as scalar expressions of the
function's parameters (``t.id = (jsonb_populate_record(null::table, $1)).id``),
which the planner always uses as an index condition on ``(tenant_id, id)``.
Same signature, same result, same checks; only the lookup changes.

Revision ID: 0013_row_version_probe
Revises: 0012_vectorchord_lexical
"""

from __future__ import annotations

from alembic import op

revision = "0013_row_version_probe"
down_revision = "0012_vectorchord_lexical"
branch_labels = None
depends_on = None

# The settings that make to_jsonb(row) deterministic (as in 0006; frozen here).
CANONICAL_SETTINGS = (
    "set timezone = 'UTC' set datestyle = 'ISO, YMD' set intervalstyle = 'iso_8601' "
    "set extra_float_digits = 1 set bytea_output = 'hex'"
)


def _row_version(condition: str, source: str, source_args: str) -> str:
    return r"""
create or replace function provenance.row_version(p_table regclass, p_row_id jsonb,
                                                  p_tenant uuid default auth.tenant_id())
    returns bytea
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
    """ + CANONICAL_SETTINGS + r"""
as $$
declare
    v_key text[] := provenance.key_columns(p_table);
    v_cond text;
    v_hash bytea;
begin
    if p_table not in (select provenance.chained_tables()) then
        raise exception 'table % is not a chained memory table', p_table using errcode = '22023';
    end if;
    if p_row_id is null or jsonb_typeof(p_row_id) <> 'object'
       or (select array_agg(k order by k) from jsonb_object_keys(p_row_id) as k)
          is distinct from (select array_agg(k order by k) from unnest(v_key) as k) then
        raise exception 'a row id of % is an object with exactly the keys %', p_table,
            array_to_string(v_key, ', ') using errcode = '22023';
    end if;
    v_cond := (select string_agg(format(""" + condition + r""", c, p_table), ' and ')
                 from unnest(v_key) as c);
    execute format('select sha256(convert_to(to_jsonb(t)::text, ''UTF8'')) from """ + source + r"""'
                   ' where t.tenant_id = $2 and %s', """ + source_args + r""", v_cond)
       into v_hash using p_row_id, p_tenant;
    return v_hash;
end
$$;
comment on function provenance.row_version(regclass, jsonb, uuid) is
    'The version (SHA-256 of the canonical image) of a row as the caller sees it, or null.';
"""


# Each key column compared with a scalar expression of the parameters: an index condition.
PROBE = _row_version("'t.%1$I = (jsonb_populate_record(null::%2$s, $1)).%1$I'", "%s t", "p_table")
# 0006's join, for the downgrade.
JOIN = _row_version("'t.%1$I = k.%1$I'", "%s t, jsonb_populate_record(null::%s, $1) k",
                    "p_table, p_table")


def upgrade() -> None:
    op.execute(PROBE)


def downgrade() -> None:
    op.execute(JOIN)
