"""``provenance.row_versions``: the versions of many rows of one table in one query.

Why: every recall appends a receipt that pins the version of each row it served
(``orchestrator.audit.receipts.append_served``), and it read them one
``provenance.row_version`` call per row. Each call checks the table against the
chained tables (a scan of ``pg_trigger``) and plans its own dynamic query under
RLS, about a millisecond apiece: with some thirty served rows the receipt was the
largest stage of a recall after the statement itself (36-47 ms p50 in
benchmarks/recall_latency.py, 10k chunks). ``row_versions`` does the check once
and reads every row of the table with one ``id = any($1)`` probe of its primary
key. Tables keyed by ``(tenant_id, id)`` only (every table recall serves);
the same canonical image and hash as ``row_version``, the same errors, and rows
the caller cannot see are simply absent. The receipt's seal trigger
(``tg_receipts__seal``), which checks every served version against the row
again, uses it the same way; items it cannot take (a composite key, a malformed
id) still go through ``row_version`` and get its messages.

Revision ID: 0016_row_versions
Revises: 0015_rls_estimates
"""

from __future__ import annotations

from alembic import op

revision = "0016_row_versions"
down_revision = "0015_rls_estimates"
branch_labels = None
depends_on = None

# The settings that make to_jsonb(row) deterministic (as in 0006 and 0013; frozen here).
CANONICAL_SETTINGS = (
    "set timezone = 'UTC' set datestyle = 'ISO, YMD' set intervalstyle = 'iso_8601' "
    "set extra_float_digits = 1 set bytea_output = 'hex'"
)

ROW_VERSIONS = r"""
create function provenance.row_versions(p_table regclass, p_ids uuid[],
                                        p_tenant uuid default auth.tenant_id())
    returns table (id uuid, version bytea)
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
    """ + CANONICAL_SETTINGS + r"""
as $$
begin
    if p_table not in (select provenance.chained_tables()) then
        raise exception 'table % is not a chained memory table', p_table using errcode = '22023';
    end if;
    if provenance.key_columns(p_table) is distinct from array['id'] then
        raise exception 'rows of % are not identified by id alone; use provenance.row_version',
            p_table using errcode = '22023';
    end if;
    return query execute format(
        'select t.id, sha256(convert_to(to_jsonb(t)::text, ''UTF8'')) from %s t'
        ' where t.tenant_id = $2 and t.id = any($1)', p_table)
        using p_ids, p_tenant;
end
$$;
comment on function provenance.row_versions(regclass, uuid[], uuid) is
    'The versions (SHA-256 of the canonical image) of the rows of an id-keyed chained table the '
    'caller sees among p_ids, in one query; rows it cannot see are absent. As row_version, per row.';
revoke all on function provenance.row_versions(regclass, uuid[], uuid) from public;
grant execute on function provenance.row_versions(regclass, uuid[], uuid) to engram_app, engram_verifier;
"""


# The receipt's seal checks every served version against the row as it is now, the same
# check as 0006's, but with one row_versions probe per id-keyed table; any other item (a
# composite key, a malformed id) goes through row_version and its messages as before.
SEAL = r"""
create or replace function provenance.tg_receipts__seal() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_item jsonb;
    v_table regclass;
    v_version bytea;
    v_hex text;
    v_current jsonb := '{}';
    v_clean jsonb := '[]';
begin
    if jsonb_typeof(new.evidence) is distinct from 'array' then
        raise exception 'receipt evidence must be a JSON array' using errcode = '22023';
    end if;
    for v_item in select x from jsonb_array_elements(new.evidence) as x loop
        if jsonb_typeof(v_item) <> 'object' or jsonb_typeof(v_item -> 'table') <> 'string'
           or jsonb_typeof(v_item -> 'row_id') <> 'object'
           or coalesce(v_item ->> 'version', '') !~ '^[0-9a-f]{64}$' then
            raise exception 'each evidence item needs table (text), row_id (object) and version '
                            '(64 hex digits); got %', v_item using errcode = '22023';
        end if;
        if to_regclass(v_item ->> 'table') is null then
            raise exception 'evidence names an unknown table %', v_item ->> 'table' using errcode = '22023';
        end if;
    end loop;
    -- Current versions of the id-keyed items, one probe per table: {"table": {"id": "hex"}}.
    for v_table in
        select distinct to_regclass(x ->> 'table') from jsonb_array_elements(new.evidence) as x
         where provenance.key_columns(to_regclass(x ->> 'table')) = array['id']
    loop
        v_current := v_current || jsonb_build_object(v_table::text, coalesce((
            select jsonb_object_agg(v.id::text, encode(v.version, 'hex'))
              from provenance.row_versions(v_table, array(
                       select (x -> 'row_id' ->> 'id')::uuid from jsonb_array_elements(new.evidence) as x
                        where to_regclass(x ->> 'table') = v_table
                          and (select array_agg(k) from jsonb_object_keys(x -> 'row_id') as k) = array['id']
                          and x -> 'row_id' ->> 'id' ~* '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$'),
                   new.tenant_id) as v), '{}'));
    end loop;
    for v_item in select x from jsonb_array_elements(new.evidence) as x loop
        v_table := to_regclass(v_item ->> 'table');
        if v_current ? v_table::text
           and (select array_agg(k) from jsonb_object_keys(v_item -> 'row_id') as k) = array['id']
           and v_item -> 'row_id' ->> 'id' ~* '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$' then
            v_hex := v_current -> v_table::text ->> lower(v_item -> 'row_id' ->> 'id');
        else
            v_version := provenance.row_version(v_table, v_item -> 'row_id', new.tenant_id);
            v_hex := encode(v_version, 'hex');
        end if;
        if v_hex is null then
            raise exception 'evidence %.% does not exist or is not visible', v_item ->> 'table',
                v_item -> 'row_id' using errcode = '23503';
        end if;
        if v_hex <> v_item ->> 'version' then
            raise exception 'evidence % % was served at version % but is now at version %',
                v_item ->> 'table', v_item -> 'row_id', v_item ->> 'version', v_hex
                using errcode = '23514';
        end if;
        v_clean := v_clean || jsonb_build_array(jsonb_build_object(
            'table', provenance.table_name(v_table), 'row_id', v_item -> 'row_id',
            'version', v_item ->> 'version'));
    end loop;
    new.evidence := v_clean;
    new.asked_by := coalesce(auth.user_id(), new.asked_by);
    new.asked_at := clock_timestamp();
    new.activity_id := coalesce(new.activity_id,
                                nullif(current_setting('engram.activity_id', true), '')::uuid);
    new.receipt_hash := provenance.receipt_hash(new.tenant_id, new.id, new.asked_by, new.asked_at,
                                                new.question_hash, new.evidence, new.rendered_hash);
    return new;
end
$$;
"""


# 0006's seal (one row_version per item), for the downgrade.
SEAL_0006 = r"""
create or replace function provenance.tg_receipts__seal() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_item jsonb;
    v_table regclass;
    v_version bytea;
    v_clean jsonb := '[]';
begin
    if jsonb_typeof(new.evidence) is distinct from 'array' then
        raise exception 'receipt evidence must be a JSON array' using errcode = '22023';
    end if;
    for v_item in select x from jsonb_array_elements(new.evidence) as x loop
        if jsonb_typeof(v_item) <> 'object' or jsonb_typeof(v_item -> 'table') <> 'string'
           or jsonb_typeof(v_item -> 'row_id') <> 'object'
           or coalesce(v_item ->> 'version', '') !~ '^[0-9a-f]{64}$' then
            raise exception 'each evidence item needs table (text), row_id (object) and version '
                            '(64 hex digits); got %', v_item using errcode = '22023';
        end if;
        v_table := to_regclass(v_item ->> 'table');
        if v_table is null then
            raise exception 'evidence names an unknown table %', v_item ->> 'table' using errcode = '22023';
        end if;
        v_version := provenance.row_version(v_table, v_item -> 'row_id', new.tenant_id);
        if v_version is null then
            raise exception 'evidence %.% does not exist or is not visible', v_item ->> 'table',
                v_item -> 'row_id' using errcode = '23503';
        end if;
        if encode(v_version, 'hex') <> v_item ->> 'version' then
            raise exception 'evidence % % was served at version % but is now at version %',
                v_item ->> 'table', v_item -> 'row_id', v_item ->> 'version', encode(v_version, 'hex')
                using errcode = '23514';
        end if;
        v_clean := v_clean || jsonb_build_array(jsonb_build_object(
            'table', provenance.table_name(v_table), 'row_id', v_item -> 'row_id',
            'version', v_item ->> 'version'));
    end loop;
    new.evidence := v_clean;
    new.asked_by := coalesce(auth.user_id(), new.asked_by);
    new.asked_at := clock_timestamp();
    new.activity_id := coalesce(new.activity_id,
                                nullif(current_setting('engram.activity_id', true), '')::uuid);
    new.receipt_hash := provenance.receipt_hash(new.tenant_id, new.id, new.asked_by, new.asked_at,
                                                new.question_hash, new.evidence, new.rendered_hash);
    return new;
end
$$;
"""


def upgrade() -> None:
    op.execute(ROW_VERSIONS)
    op.execute(SEAL)


def downgrade() -> None:
    op.execute(SEAL_0006)
    op.execute("drop function provenance.row_versions(regclass, uuid[], uuid)")
