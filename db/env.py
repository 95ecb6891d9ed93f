"""Alembic environment: runs Engram's migrations as ``engram_owner``.

The connection comes from ``config.attributes["connection"]`` (the CLI and the
tests pass one) or from the admin URL of the configured database. Once the
``engram_owner`` role exists the migration switches to it, so every object is
owned by that role and never by the connecting superuser.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool, text

from orchestrator.db.schema import COMPARE_OPTIONS, metadata

config = context.config


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
        transactional_ddl=True,
        **COMPARE_OPTIONS,
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
