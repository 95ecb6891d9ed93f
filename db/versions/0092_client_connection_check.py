"""A statement whose client has gone is stopped within seconds, not run to its end.

Why: PostgreSQL notices that a client went away only when it next writes to it, which a
statement does when it returns rows. After ``engram up`` was stopped during the derive tick's
conflict sweep of a large tenant (minutes, before 0091), the sweep's backend ran on for
more than ten minutes of CPU, holding the tenant's conflict lock, while the next ``engram up``
waited on that lock and competed for the cores. ``client_connection_check_interval`` makes a
backend check its socket at that interval while a statement runs and cancel it when the
client is gone.

What changes: the three roles Engram logs in as (``engram_app``, ``engram_worker``,
``engram_auditor``) get ``client_connection_check_interval = 10s`` in this database (as
0003 and 0014 set ``engram_app``'s settings). It applies to connections made after the
migration. Setting a role's parameter needs ``CREATEROLE`` or a superuser; a login without
either is told so with a warning and the migration goes on (the setting is an operator's
safety net, not part of the data model).

Revision ID: 0092_client_connection_check
Revises: 0091_conflict_sweep_shaped
"""

from __future__ import annotations

from alembic import op

revision = "0092_client_connection_check"
down_revision = "0091_conflict_sweep_shaped"
branch_labels = None
depends_on = None

ROLES = ("engram_app", "engram_worker", "engram_auditor")
INTERVAL = "10s"


def _each_role(action: str) -> str:
    """A block that runs ``action`` (``set ... = ...`` or ``reset ...``) for each login role in
    this database, warning instead of failing where the migrating login may not."""
    statements = " ".join(
        f"execute format('alter role {role} in database %I {action}', current_database());"
        for role in ROLES)
    return ("do $s$ begin " + statements + " exception when insufficient_privilege then "
            "raise warning 'engram: % may not set the login roles'' parameters, so "
            "client_connection_check_interval stays unset: a statement whose client has gone "
            "runs to its end', current_user; end $s$")


def upgrade() -> None:
    op.execute("reset role")
    op.execute(_each_role(f"set client_connection_check_interval = ''{INTERVAL}''"))
    op.execute("set role engram_owner")


def downgrade() -> None:
    op.execute("reset role")
    op.execute(_each_role("reset client_connection_check_interval"))
    op.execute("set role engram_owner")
