"""Alembic environment: runs Engram's migrations as ``engram_owner``.

The connection comes from ``config.attributes["connection"]`` (the CLI and the
tests pass one) or from the admin URL of the configured database. Once the
``engram_owner`` role exists the migration switches to it, so every object is
owned by that role and never by the connecting superuser.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool, text

from orchestrator.db.schema import ENGRAM_SCHEMAS, TIER_INDEXES, metadata

config = context.config


def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    if type_ == "table":
        return obj.schema in ENGRAM_SCHEMAS
    if type_ == "index" and name in TIER_INDEXES:
        return False
    return True


def include_name(name, type_, parent_names):  # type: ignore[no-untyped-def]
    if type_ == "schema":
        return name in ENGRAM_SCHEMAS
    return True


def _run(connection: Connection) -> None:
    owner = connection.execute(text(
        "select pg_has_role(current_user, 'engram_owner', 'USAGE') "
        "from pg_roles where rolname = 'engram_owner'"
    )).scalar()
    if owner:
        # Alembic's own bookkeeping table lives in public, which engram_owner may not
        # create in; make it as the connecting admin first and let the owner write it.
        connection.execute(text(
            "create table if not exists public.alembic_version (version_num varchar(32) not null, "
            "constraint alembic_version_pkc primary key (version_num))"
        ))
        connection.execute(text("grant all on table public.alembic_version to engram_owner"))
        connection.execute(text("set role engram_owner"))
    context.configure(
        connection=connection,
        target_metadata=metadata,
        include_schemas=True,
        include_object=include_object,
        include_name=include_name,
        compare_type=True,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.execute(text("reset role"))


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from orchestrator.db.engine import Database

        url = Database().admin_url()
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()


if context.is_offline_mode():
    raise SystemExit("Engram's migrations run online only (they inspect the server's extensions).")
run_migrations_online()
