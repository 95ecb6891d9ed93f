"""A recall's receipt pins the versions of the rows it served with one planned query.

Why: the seal trigger (``tg_receipts__seal``, 0040) pins each served row's version as it
is now: for every table the receipt names, one ``provenance.row_versions`` call, which
checks the table against the catalog again and runs a dynamic query (``execute
format(...)``) that PostgreSQL plans afresh each time, row-level-security policies and
all. A recall serves rows of up to eleven tables, so a receipt paid up to eleven such
plans: on a 10-chunk tenant (27 served rows from 8 tables) the receipt's INSERT took
7.4 ms p50 of a 40 ms recall, and the same versions read by one prepared, statically
written query took 2.1 ms against 4.6 ms through ``row_versions`` (measured with
benchmarks/recall_latency.py's kept 10k corpus).

What changes:

* ``provenance.served_row_versions(p_ids jsonb, p_tenant uuid)``: the versions of the
  rows named in ``p_ids`` (``{"<schema.table>": ["<id>", ...]}``) for the eleven tables
  whose rows recall serves (``SERVED_TABLES``), one branch per table in one static
  query. PL/pgSQL keeps its plan for the connection; a branch whose table is absent from
  ``p_ids`` is skipped by a one-time filter. The version is exactly ``row_versions``'s:
  SHA-256 of the row's canonical image, under the same frozen settings, as the caller
  (security invoker: RLS decides what it sees, as before).
* ``tg_receipts__seal`` reads the chained tables once per receipt (not once per table),
  sends the served tables among ``SERVED_TABLES`` to that one query, and keeps
  ``row_versions`` for any other chained id-keyed table and ``row_version`` for the rest.
  Everything it refuses, and every message, is as in 0040; the sealed receipt is the
  same bytes.

Revision ID: 0082_receipt_seal_static
Revises: 0071_citus_distribution
"""

from __future__ import annotations

from alembic import context, op

revision = "0082_receipt_seal_static"
down_revision = "0071_citus_distribution"
branch_labels = None
depends_on = None

# The settings that make to_jsonb(row) deterministic (as in 0006, 0016 and 0040; frozen here).
CANONICAL_SETTINGS = (
    "set timezone = 'UTC' set datestyle = 'ISO, YMD' set intervalstyle = 'iso_8601' "
    "set extra_float_digits = 1 set bytea_output = 'hex'"
)

# The tables whose rows recall serves (orchestrator/recall: statement.py and tail.py).
SERVED_TABLES = (
    "sources.documents", "sources.chunks", "knowledge.entities", "knowledge.fact_claim",
    "memory.working_memory", "memory.profiles", "memory.episodes", "memory.observations",
    "memory.decisions", "memory.communities", "memory.raptor_nodes",
)

_BRANCH = """
        select '{table}'::text, t.id, sha256(convert_to(to_jsonb(t)::text, 'UTF8'))
          from {table} t
         where p_ids ? '{table}' and t.tenant_id = p_tenant
           and t.id = any (array(select jsonb_array_elements_text(p_ids -> '{table}')::uuid))"""

SERVED_ROW_VERSIONS = r"""
create function provenance.served_row_versions(p_ids jsonb, p_tenant uuid)
    returns table (table_name text, id uuid, version bytea)
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp set plan_cache_mode = force_generic_plan
    """ + CANONICAL_SETTINGS + r"""
as $$
begin
    return query""" + "\n        union all".join(_BRANCH.format(table=t) for t in SERVED_TABLES) + r""";
end
$$;
comment on function provenance.served_row_versions(jsonb, uuid) is
    'The versions (as provenance.row_versions: SHA-256 of the canonical image) of the rows '
    'named in p_ids ({"schema.table": [id, ...]}) of the tables recall serves, in one planned '
    'query; rows the caller cannot see, and tables outside that set, are absent.';
revoke all on function provenance.served_row_versions(jsonb, uuid) from public;
grant execute on function provenance.served_row_versions(jsonb, uuid) to engram_app, engram_verifier;
"""

# tg_receipts__seal as 0040 wrote it, with three changes (each anchor must occur once):
# the chained tables are read once per receipt; the served tables' ids are collected and
# their versions read by served_row_versions after the loop (others as before); versions
# are keyed by the canonical table name, so two spellings of one table share its ids.
SEAL_PATCHES = (
    ("""    v_current jsonb := '{}';    -- {"<table as written> <id>": "<version hex>"}
""",
     """    v_current jsonb := '{}';    -- {"<schema.table> <id>": "<version hex>"}
    v_chained regclass[] := array(select provenance.chained_tables());
    v_served jsonb := '{}';     -- {"<schema.table>": [ids]} for served_row_versions
    v_ids uuid[];
"""),
    ("""        if v_table in (select provenance.chained_tables())
           and provenance.key_columns(v_table) = array['id'] then
            v_current := v_current || coalesce((
                select jsonb_object_agg(v_name || ' ' || v.id::text, encode(v.version, 'hex'))
                  from provenance.row_versions(v_table, array(
                           select (x -> 'row_id' ->> 'id')::uuid from jsonb_array_elements(new.evidence) as x
                            where x ->> 'table' = v_name and (x -> 'row_id') - 'id'::text = '{}'::jsonb
                              and x -> 'row_id' ->> 'id' ~ '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$'),
                       new.tenant_id) as v), '{}');
        end if;
    end loop;
""",
     """        if v_table = any (v_chained) and (v_canonical ->> v_name = any (array[{served}])
                                          or provenance.key_columns(v_table) = array['id']) then
            v_ids := array(
                select (x -> 'row_id' ->> 'id')::uuid from jsonb_array_elements(new.evidence) as x
                 where x ->> 'table' = v_name and (x -> 'row_id') - 'id'::text = '{}'::jsonb
                   and x -> 'row_id' ->> 'id' ~ '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$');
            if v_canonical ->> v_name = any (array[{served}]) then
                v_served := v_served || jsonb_build_object(v_canonical ->> v_name,
                    coalesce(v_served -> (v_canonical ->> v_name), '[]') || to_jsonb(v_ids));
            else
                v_current := v_current || coalesce((
                    select jsonb_object_agg((v_canonical ->> v_name) || ' ' || v.id::text,
                                            encode(v.version, 'hex'))
                      from provenance.row_versions(v_table, v_ids, new.tenant_id) as v), '{}');
            end if;
        end if;
    end loop;
    if v_served <> '{}' then
        v_current := v_current || coalesce((
            select jsonb_object_agg(v.table_name || ' ' || v.id::text, encode(v.version, 'hex'))
              from provenance.served_row_versions(v_served, new.tenant_id) as v), '{}');
    end if;
""".replace("{served}", ", ".join(f"'{t}'" for t in SERVED_TABLES))),
    ("""            v_hex := v_current ->> (v_item ->> 'table' || ' ' || v_key);
""",
     """            v_hex := v_current ->> ((v_canonical ->> (v_item ->> 'table')) || ' ' || v_key);
"""),
)


def _released_seal() -> str:
    """0040's seal trigger as released: alembic has loaded every revision's module (0040 is
    pinned by db/released.sha256, so it cannot change under this patch)."""
    script = context.script.get_revision("0040_receipt_batches")
    assert script is not None
    seal_sql: str = script.module.SEAL
    return seal_sql


def seal() -> str:
    """0040's seal trigger with SEAL_PATCHES applied."""
    text = _released_seal()
    for old, new in SEAL_PATCHES:
        if text.count(old) != 1:
            raise RuntimeError(f"0040's seal trigger does not hold this line once: {old[:80]!r}")
        text = text.replace(old, new)
    return text


def upgrade() -> None:
    op.execute(SERVED_ROW_VERSIONS)
    op.execute(seal())


def downgrade() -> None:
    op.execute(_released_seal())
    op.execute("drop function provenance.served_row_versions(jsonb, uuid)")
