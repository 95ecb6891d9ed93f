"""Migration 0071's Citus distribution, run here against stand-ins for Citus's functions.

No Citus binaries exist for this machine (none on PyPI, Debian or npm), so the statements
0071 runs when the ``citus`` extension is present are executed against stand-in
``create_reference_table`` / ``create_distributed_table`` functions (in a scratch schema,
inside a transaction that is rolled back) that enforce the rules Citus enforces when it
distributes a table: the distribution column exists and is NOT NULL; every primary key and
unique index includes it; a colocated table joins a group that already exists with the
same column type; a foreign key points at the table itself, at a reference table already
placed, or at a distributed table of the same group, with the distribution column mapped
to the distribution column; a reference table references only reference tables. So the
order, the lists and the keys are checked by PostgreSQL on the real schema; whether Citus
itself accepts them is proven only on a Citus cluster (docs/scale-out.md).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError

REVISION = Path(__file__).resolve().parents[1] / "db" / "versions" / "0071_citus_distribution.py"


def _revision() -> ModuleType:
    spec = importlib.util.spec_from_file_location(REVISION.stem, REVISION)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REV = _revision()

STAND_INS = r"""
create schema citus_stub;
create table citus_stub.placed (rel regclass primary key, kind text not null, grp regclass,
                                col text);

create function citus_stub.create_reference_table(table_name regclass) returns void
language plpgsql as $$
declare bad text;
begin
    select string_agg(c.confrelid::regclass::text, ', ') into bad
      from pg_constraint c
     where c.conrelid = table_name and c.contype = 'f' and c.confrelid <> table_name
       and c.confrelid not in (select rel from citus_stub.placed where kind = 'reference');
    if bad is not null then
        raise exception 'reference table % references non-reference tables: %', table_name, bad;
    end if;
    insert into citus_stub.placed values (table_name, 'reference', null, null);
end $$;

create function citus_stub.create_distributed_table(table_name regclass, distribution_column text,
                                                    colocate_with text default 'default')
returns void language plpgsql as $$
declare
    v_col int2;
    v_type oid;
    v_grp regclass := table_name;
    bad text;
begin
    select a.attnum, a.atttypid into v_col, v_type from pg_attribute a
     where a.attrelid = table_name and a.attname = distribution_column and not a.attisdropped;
    if v_col is null then
        raise exception '% has no column %', table_name, distribution_column;
    end if;
    if not (select attnotnull from pg_attribute where attrelid = table_name and attnum = v_col) then
        raise exception 'distribution column %.% may be null', table_name, distribution_column;
    end if;
    select string_agg(i.indexrelid::regclass::text, ', ') into bad from pg_index i
     where i.indrelid = table_name and i.indisunique and not (v_col = any(i.indkey::int2[]));
    if bad is not null then
        raise exception 'unique keys of % lack the distribution column: %', table_name, bad;
    end if;
    if colocate_with <> 'default' then
        select p.grp into v_grp from citus_stub.placed p
         where p.rel = colocate_with::regclass and p.kind = 'distributed';
        if v_grp is null then
            raise exception 'cannot colocate % with %: not distributed yet', table_name, colocate_with;
        end if;
        if (select a.atttypid from citus_stub.placed p join pg_attribute a
              on a.attrelid = p.rel and a.attname = p.col where p.rel = colocate_with::regclass)
           <> v_type then
            raise exception 'cannot colocate %: distribution column types differ', table_name;
        end if;
    end if;
    select string_agg(c.conname || ' -> ' || c.confrelid::regclass::text, ', ') into bad
      from pg_constraint c
     where c.conrelid = table_name and c.contype = 'f' and c.confrelid <> table_name
       and c.confrelid not in (select rel from citus_stub.placed where kind = 'reference')
       and not exists (
           select 1 from citus_stub.placed p
             join pg_attribute a on a.attrelid = p.rel and a.attname = p.col
             join generate_subscripts(c.conkey, 1) as k(i) on true
            where p.rel = c.confrelid and p.kind = 'distributed' and p.grp = v_grp
              and c.conkey[k.i] = v_col and c.confkey[k.i] = a.attnum);
    if bad is not null then
        raise exception 'foreign keys of % cannot be kept on one shard: %', table_name, bad;
    end if;
    insert into citus_stub.placed values (table_name, 'distributed', v_grp, distribution_column);
end $$;
"""


@pytest.fixture
def stubbed(admin_engine: Engine) -> Iterator[Connection]:
    """A transaction with the stand-ins first on the search path; rolled back afterwards."""
    with admin_engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.exec_driver_sql(STAND_INS.replace("%", "%%"))
            conn.exec_driver_sql("set local search_path = citus_stub, public")
            yield conn
        finally:
            trans.rollback()


def _run(conn: Connection, statements: list[str]) -> None:
    for statement in statements:
        conn.exec_driver_sql(statement)


def _engram_tables(conn: Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute(text(
        "select n.nspname || '.' || c.relname from pg_class c join pg_namespace n "
        "on n.oid = c.relnamespace where c.relkind in ('r', 'p') "
        "and pg_get_userbyid(n.nspowner) = 'engram_owner'"))}


def _unplaced(conn: Connection) -> set[str]:
    placed = {str(r[0]) for r in conn.execute(text("select rel::text from citus_stub.placed"))}
    return _engram_tables(conn) - placed


def test_the_distribution_places_every_table(stubbed: Connection) -> None:
    _run(stubbed, [*REV.CITUS_SETUP, *REV.citus_statements()])
    assert _unplaced(stubbed) == set(), "every Engram table is distributed or a reference table"
    kinds = dict(stubbed.execute(text("select rel::text, kind from citus_stub.placed")).all())
    assert {t for t, k in kinds.items() if k == "reference"} == set(REV.REFERENCE_TABLES)
    groups = {str(r[0]) for r in stubbed.execute(text(
        "select distinct grp::text from citus_stub.placed where kind = 'distributed'"))}
    assert groups == {REV.COLOCATION_ANCHOR}, "one colocation group: a tenant's rows share a node"
    assert stubbed.execute(text(
        "select value from engram.installation where key = 'distribution'")).scalar() == "citus"


def test_the_provenance_chain_is_colocated(stubbed: Connection) -> None:
    """The chain's tables (events, pending, pending_commits, activities, agents) are in the
    tenant's colocation group: the commit trigger's advisory lock, its last-seq read and its
    inserts for one tenant all run on the node that holds that tenant's shard."""
    _run(stubbed, [*REV.CITUS_SETUP, *REV.citus_statements()])
    chain = {"provenance.events", "provenance.pending", "provenance.pending_commits",
             "provenance.activities", "provenance.agents"}
    rows = dict(stubbed.execute(text(
        "select rel::text, grp::text from citus_stub.placed where rel::text = any(:t)"),
        {"t": list(chain)}).all())
    assert set(rows) == chain and set(rows.values()) == {REV.COLOCATION_ANCHOR}


def test_every_tenant_table_of_the_catalog_is_listed(admin_engine: Engine) -> None:
    """A new tenant table must join the distribution (here or in its own migration)."""
    with admin_engine.connect() as conn:
        tables = _engram_tables(conn)
    assert tables == set(REV.DISTRIBUTED_TABLES) | set(REV.REFERENCE_TABLES)
    assert len(REV.DISTRIBUTED_TABLES) == len(set(REV.DISTRIBUTED_TABLES))


# -- negative controls: each broken variant is refused ---------------------------------


def _distribute(table: str, column: str = "tenant_id", colocate: str | None = None) -> str:
    extra = f", colocate_with => '{colocate}'" if colocate else ""
    return f"select create_distributed_table('{table}', '{column}'{extra})"


def test_a_child_before_its_parent_is_refused(stubbed: Connection) -> None:
    refs = [f"select create_reference_table('{t}')" for t in REV.REFERENCE_TABLES]
    with pytest.raises(DBAPIError, match="cannot be kept on one shard"):
        _run(stubbed, [*refs, _distribute("auth.scopes"),
                       _distribute("sources.chunks", colocate="auth.scopes")])


def test_a_wrong_distribution_column_is_refused(stubbed: Connection) -> None:
    with pytest.raises(DBAPIError, match="unique keys of .* lack the distribution column"):
        _run(stubbed, [_distribute("auth.scopes", "name")])


def test_colocating_with_an_undistributed_table_is_refused(stubbed: Connection) -> None:
    with pytest.raises(DBAPIError, match="not distributed yet"):
        _run(stubbed, [_distribute("sources.documents", colocate="auth.scopes")])


def test_a_table_left_out_is_noticed(stubbed: Connection) -> None:
    statements = [s for s in REV.citus_statements() if "memory.value_daily" not in s]
    _run(stubbed, [*REV.CITUS_SETUP, *statements])
    assert _unplaced(stubbed) == {"memory.value_daily"}


def test_a_broken_statement_is_caught(stubbed: Connection) -> None:
    with pytest.raises(ProgrammingError, match="syntax error"):
        _run(stubbed, ["select create_distributed_table('sources.chunks' 'tenant_id'"])
