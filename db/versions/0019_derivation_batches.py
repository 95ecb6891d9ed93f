"""Derivation edges are checked per statement: a batch of edges no longer pays two ``row_version`` calls each.

Why: every derived row a job writes records ``wasDerivedFrom`` edges to its
inputs (a RAPTOR node to its children, a community to its members, a claim to
its chunk), and 0006's row trigger ``tg_derivations__versions`` pinned both
versions of every edge with ``provenance.row_version``: a chained-table check,
a key-column lookup and a freshly planned dynamic query, twice per edge. Measured
at 1.24 ms per edge (2,000 chunk -> document edges in one statement, as the app
role): the largest phase of a RAPTOR build (17.4 s of 35 s at 10k chunks in
benchmarks/derive.py) and of an incremental community update. Checked per
statement the same 2,000 edges take 0.96 s.

Now the writer may send the versions it read, as a recall receipt already does
(0016), and the database checks them in bulk:

* ``provenance.current_versions(tables[], row_ids[])``: element by element, for
  each row id that is exactly ``{"id": <uuid>}`` (lower case, canonical), the
  current version of the row of an id-keyed chained table as the caller sees
  it, with one ``provenance.row_versions`` probe per table; null for anything else.
  The writer reads its versions with it (``record_derivations``) and the check below
  compares with it, so both sides apply the same rule.
* ``tg_derivations__versions`` (before insert, per row, through
  ``provenance.derivation_version``) keeps a written version only for such a row
  id; every other written version is checked at once against ``row_version`` (23503
  when the row is not there or not visible, 23514 when it is at another version). An
  edge sent without versions is pinned as before.
* ``tg_derivations__check_versions`` (after insert, per statement, over the new
  rows) compares every id-key end with ``current_versions`` and refuses the whole
  statement at the first difference: 23503 when the row is absent or invisible (or
  ``row_version``'s 22023 when its table is not chained or not keyed by id), 23514
  when it has another version.

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

# Whether a row id is exactly {"id": <uuid in lower-case canonical form>}: the ids whose
# versions are read and checked in bulk. Defined once, here, and spelled into the functions
# below as a plain expression rather than called: a function of the provenance schema pins
# search_path (sql_checks/22), and that SET cost 25 us a call, several calls per edge.
# CASE, so that a scalar is never subtracted from, whatever order a planner gives the tests.
_ID_KEY = ("(case when jsonb_typeof({v}) = 'object' then {v} - 'id'::text = '{{}}'::jsonb "
           "and {v} ->> 'id' ~ '^[0-9a-f]{{8}}-([0-9a-f]{{4}}-){{3}}[0-9a-f]{{12}}$' else false end)")

SHAPE = r"""
create function provenance.current_versions(p_tables text[], p_row_ids jsonb[],
                                            p_tenant uuid default auth.tenant_id())
    returns bytea[]
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_keyed boolean[];
    v_name text;
    v_table regclass;
    v_map jsonb := '{}';  -- {"<table as named> <id>": "<version hex>"}: flat, a lookup copies nothing
begin
    if cardinality(p_tables) is distinct from cardinality(p_row_ids) then
        raise exception 'current_versions needs as many row ids as tables (% tables, % row ids)',
            cardinality(p_tables), cardinality(p_row_ids) using errcode = '22023';
    end if;
    -- Each element's shape once, side by side with the inputs from here on.
    v_keyed := array(select """ + _ID_KEY.format(v="x.rid") + r"""
                       from unnest(p_row_ids) with ordinality as x(rid, ord) order by x.ord);
    for v_name in
        select distinct x.tab from unnest(p_tables, v_keyed) as x(tab, k) where x.k and x.tab is not null
    loop
        v_table := to_regclass(v_name);
        continue when v_table is null or v_table not in (select provenance.chained_tables())
                   or provenance.key_columns(v_table) is distinct from array['id'];
        v_map := v_map || coalesce((
            select jsonb_object_agg(v_name || ' ' || v.id::text, encode(v.version, 'hex'))
              from provenance.row_versions(v_table, array(
                       select distinct (x.rid ->> 'id')::uuid
                         from unnest(p_tables, v_keyed, p_row_ids) as x(tab, k, rid)
                        where x.tab = v_name and x.k), p_tenant) as v), '{}');
    end loop;
    return array(
        select case when x.k then decode(v_map ->> (x.tab || ' ' || (x.rid ->> 'id')), 'hex') end
          from unnest(p_tables, v_keyed, p_row_ids) with ordinality as x(tab, k, rid, ord)
         order by x.ord);
end
$$;
comment on function provenance.current_versions(text[], jsonb[], uuid) is
    'Element by element, the current version of the row (table, row id) as the caller sees it, '
    'for id-keyed rows of id-keyed chained tables (one row_versions probe per table); null for '
    'any other element and for rows the caller cannot see.';
-- As row_versions (0016), which it calls.
revoke all on function provenance.current_versions(text[], jsonb[], uuid) from public;
grant execute on function provenance.current_versions(text[], jsonb[], uuid) to engram_app, engram_verifier;
"""

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
    if p_written is not null and """ + _ID_KEY.format(v="p_row_id") + r""" then
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
begin
    -- Per tenant, both ends of every new edge side by side with their current versions (the
    -- aggregates of one query take its rows in the same order, so the arrays line up).
    for g in
        select n.tenant_id, array_agg(n.derived_table) || array_agg(n.source_table) as tabs,
               array_agg(n.derived_row_id) || array_agg(n.source_row_id) as rids,
               array_agg(n.derived_version) || array_agg(n.source_version) as written
          from new_rows n
         group by n.tenant_id
    loop
        -- An end current_versions has no version for and the row trigger pinned (a composite
        -- key) differs too; the shape, tested only then, tells the two apart.
        select x.tab, x.rid, x.written, x.cur into bad
          from unnest(g.tabs, g.rids, g.written, provenance.current_versions(g.tabs, g.rids, g.tenant_id))
               as x(tab, rid, written, cur)
         where case when x.written is not distinct from x.cur then false
                    when x.cur is not null then true
                    else """ + _ID_KEY.format(v="x.rid") + r""" end
         limit 1;
        continue when not found;
        if bad.cur is null then
            -- row_version says why, where it can (a table that is not chained or not keyed by id).
            perform provenance.row_version(to_regclass(bad.tab), bad.rid, g.tenant_id);
            raise exception 'row % % does not exist or is not visible', bad.tab, bad.rid
                using errcode = '23503';
        end if;
        raise exception 'row % % is at version %, not at the version % written', bad.tab, bad.rid,
            encode(bad.cur, 'hex'), encode(bad.written, 'hex') using errcode = '23514';
    end loop;
    return null;
end
$$;
comment on function provenance.tg_derivations__check_versions() is
    'After each insert statement: every version stored for an id-keyed row is the current version '
    'of a row the writer sees (provenance.current_versions: one probe per tenant and table), or '
    'the statement fails.';
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
    op.execute(SHAPE)
    op.execute(VERSIONS)
    op.execute(CHECK)


def downgrade() -> None:
    op.execute("revoke insert (derived_version, source_version) on provenance.derivations from engram_app")
    op.execute("drop trigger tg_derivations__check_versions on provenance.derivations")
    op.execute("drop function provenance.tg_derivations__check_versions()")
    op.execute(VERSIONS_0006)
    op.execute("drop function provenance.derivation_version(text, regclass, text, jsonb, bytea, uuid)")
    op.execute("drop function provenance.current_versions(text[], jsonb[], uuid)")
