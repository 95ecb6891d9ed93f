"""Derivation edges are checked per statement: a batch of edges no longer pays two ``row_version`` calls each.

Why: every derived row a job writes records ``wasDerivedFrom`` edges to its
inputs (a RAPTOR node to its children, a community to its members, a claim to
its chunk), and 0006's row trigger ``tg_derivations__versions`` pinned both
versions of every edge with ``provenance.row_version``: a chained-table check,
a key-column lookup and a freshly planned dynamic query, twice per edge. Measured
at 1.24 ms per edge (2,000 chunk -> document edges in one statement, as the app
role): the largest phase of a RAPTOR build (17.4 s of 35 s at 10k chunks in
benchmarks/derive.py) and of an incremental community update. Checked per
statement the same 2,000 edges take 0.97 s.

Now the writer may send the versions it read, as a recall receipt already does
(0016), and the database checks them, one ``provenance.row_versions`` probe per
table and statement:

* ``tg_derivations__versions`` (before insert, per row) keeps a written version
  only where the row id is exactly ``{"id": <uuid>}``; every other written version
  is checked at once against ``row_version`` (23503 when the row is not there or
  not visible, 23514 when it is at another version). An edge sent without
  versions is pinned as before.
* ``tg_derivations__check_versions`` (after insert, per statement, over the new
  rows) reads the current version of every id-keyed row the statement names, per
  tenant and table, and refuses the whole statement when any stored version is
  not the current version of a row the writer can see: 23503 when the row is
  absent or invisible, 23514 when it has another version. ``row_versions`` also
  refuses a table that is not chained or not keyed by id (22023).

So what a derivation row stores is still exactly what the database found, only
found in bulk; a forged or stale version never lands. ``engram_app`` gains
INSERT on ``derived_version`` and ``source_version`` for this.

Revision ID: 0019_derivation_batches
Revises: 0018_extraction
"""

from __future__ import annotations

from alembic import op

revision = "0019_derivation_batches"
down_revision = "0018_extraction"
branch_labels = None
depends_on = None

# The JSON shape of an id-keyed row id whose written version is checked per statement.
# A plain expression (no subquery), so that PL/pgSQL evaluates it without the executor.
_ID_ONLY = ("jsonb_typeof({v}) = 'object' and {v} - 'id' = '{{}}'::jsonb "
            "and {v} ->> 'id' ~ '^[0-9a-f]{{8}}-([0-9a-f]{{4}}-){{3}}[0-9a-f]{{12}}$'")

VERSIONS = r"""
create function provenance.derivation_version(p_side text, p_table regclass, p_name text,
                                              p_row_id jsonb, p_written bytea, p_tenant uuid)
    returns bytea
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_version bytea;
begin
    if p_written is not null and """ + _ID_ONLY.format(v="p_row_id") + r""" then
        return p_written;  -- checked at the end of the statement, with its table's other rows
    end if;
    v_version := provenance.row_version(p_table, p_row_id, p_tenant);
    if v_version is null then
        raise exception '% row % % does not exist or is not visible', p_side, p_name, p_row_id
            using errcode = '23503';
    end if;
    if p_written is not null and p_written <> v_version then
        raise exception '% row % % is at version %, not at the version % written', p_side, p_name,
            p_row_id, encode(v_version, 'hex'), encode(p_written, 'hex') using errcode = '23514';
    end if;
    return v_version;
end
$$;
comment on function provenance.derivation_version(text, regclass, text, jsonb, bytea, uuid) is
    'The version a derivation edge stores for one of its rows: a version written for an id-keyed '
    'row as is (tg_derivations__check_versions checks it), else the row''s current version, which '
    'a written one must equal.';

create or replace function provenance.tg_derivations__versions() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_table regclass;
begin
    v_table := to_regclass(new.derived_table);
    if v_table is null then
        raise exception 'unknown derived table %', new.derived_table using errcode = '22023';
    end if;
    new.derived_table := provenance.table_name(v_table);
    new.derived_version := provenance.derivation_version('derived', v_table, new.derived_table,
                                                         new.derived_row_id, new.derived_version,
                                                         new.tenant_id);
    if new.source_table is not null then
        v_table := to_regclass(new.source_table);
        if v_table is null then
            raise exception 'unknown source table %', new.source_table using errcode = '22023';
        end if;
        new.source_table := provenance.table_name(v_table);
        new.source_version := provenance.derivation_version('source', v_table, new.source_table,
                                                            new.source_row_id, new.source_version,
                                                            new.tenant_id);
    elsif new.source_version is not null then
        raise exception 'a derivation from an agent has no source version' using errcode = '22023';
    end if;
    new.recorded_by := auth.user_id();
    new.recorded_at := clock_timestamp();
    new.activity_id := coalesce(new.activity_id,
                                nullif(current_setting('engram.activity_id', true), '')::uuid);
    return new;
end
$$;
comment on function provenance.tg_derivations__versions() is
    'Pins the current versions of the derived and source rows (which must be visible to the writer); '
    'a version written for an id-keyed row is checked per statement by tg_derivations__check_versions.';
"""

CHECK = r"""
create function provenance.tg_derivations__check_versions() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    g record;
    bad record;
    v_current bytea;
begin
    -- Every (tenant, table) the statement names with an id-only row id, and those ids.
    for g in
        select e.tenant_id, e.tab, array_agg(distinct (e.rid ->> 'id')::uuid) as ids
          from (select n.tenant_id, n.derived_table as tab, n.derived_row_id as rid from new_rows n
                union all
                select n.tenant_id, n.source_table, n.source_row_id from new_rows n
                 where n.source_table is not null) e
         where """ + _ID_ONLY.format(v="e.rid") + r"""
         group by e.tenant_id, e.tab
    loop
        -- A set difference (hashed), not a join: the planner cannot size new_rows.
        select x.id, x.written into bad
          from (select cast(e.rid ->> 'id' as uuid) as id, e.written
                  from (select n.derived_row_id as rid, n.derived_version as written from new_rows n
                         where n.tenant_id = g.tenant_id and n.derived_table = g.tab
                        union all
                        select n.source_row_id, n.source_version from new_rows n
                         where n.tenant_id = g.tenant_id and n.source_table = g.tab) e
                 where """ + _ID_ONLY.format(v="e.rid") + r"""
                except
                select v.id, v.version from provenance.row_versions(to_regclass(g.tab), g.ids, g.tenant_id) v) x
         limit 1;
        if found then
            v_current := (select v.version
                            from provenance.row_versions(to_regclass(g.tab), array[bad.id], g.tenant_id) v);
            if v_current is null then
                raise exception 'row % {"id": "%"} does not exist or is not visible', g.tab, bad.id
                    using errcode = '23503';
            end if;
            raise exception 'row % {"id": "%"} is at version %, not at the version % written', g.tab,
                bad.id, encode(v_current, 'hex'), encode(bad.written, 'hex') using errcode = '23514';
        end if;
    end loop;
    return null;
end
$$;
comment on function provenance.tg_derivations__check_versions() is
    'After each insert statement: every version stored for an id-keyed row is the current version '
    'of a row the writer sees (one row_versions probe per tenant and table), or the statement fails.';
create trigger tg_derivations__check_versions after insert on provenance.derivations
    referencing new table as new_rows
    for each statement execute function provenance.tg_derivations__check_versions();
grant insert (derived_version, source_version) on provenance.derivations to engram_app;
"""

# 0006's trigger function (each version pinned by row_version), for the downgrade.
VERSIONS_0006 = r"""
create or replace function provenance.tg_derivations__versions() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_table regclass;
begin
    v_table := to_regclass(new.derived_table);
    if v_table is null then
        raise exception 'unknown derived table %', new.derived_table using errcode = '22023';
    end if;
    new.derived_table := provenance.table_name(v_table);
    new.derived_version := provenance.row_version(v_table, new.derived_row_id, new.tenant_id);
    if new.derived_version is null then
        raise exception 'derived row % % does not exist or is not visible', new.derived_table,
            new.derived_row_id using errcode = '23503';
    end if;
    if new.source_table is not null then
        v_table := to_regclass(new.source_table);
        if v_table is null then
            raise exception 'unknown source table %', new.source_table using errcode = '22023';
        end if;
        new.source_table := provenance.table_name(v_table);
        new.source_version := provenance.row_version(v_table, new.source_row_id, new.tenant_id);
        if new.source_version is null then
            raise exception 'source row % % does not exist or is not visible', new.source_table,
                new.source_row_id using errcode = '23503';
        end if;
    end if;
    new.recorded_by := auth.user_id();
    new.recorded_at := clock_timestamp();
    new.activity_id := coalesce(new.activity_id,
                                nullif(current_setting('engram.activity_id', true), '')::uuid);
    return new;
end
$$;
comment on function provenance.tg_derivations__versions() is
    'Pins the current versions of the derived and source rows (which must be visible to the writer).';
"""


def upgrade() -> None:
    op.execute(VERSIONS)
    op.execute(CHECK)


def downgrade() -> None:
    op.execute("revoke insert (derived_version, source_version) on provenance.derivations from engram_app")
    op.execute("drop trigger tg_derivations__check_versions on provenance.derivations")
    op.execute("drop function provenance.tg_derivations__check_versions()")
    op.execute(VERSIONS_0006)
    op.execute("drop function provenance.derivation_version(text, regclass, text, jsonb, bytea, uuid)")
