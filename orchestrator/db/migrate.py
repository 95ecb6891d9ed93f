"""Running Engram's Alembic migrations (``db/``) against a database."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from orchestrator.db.engine import MIGRATIONS_DIR, Database


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(url: str) -> str | None:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def migrate(db: Database, revision: str = "head") -> str:
    """Upgrade the configured database and set role passwords; returns the revision."""
    if not db.external:
        db.server.ensure_database(db.settings.db_name)
    db.check_server()
    upgrade(db.admin_url(), revision)
    db.set_role_passwords()
    return current_revision(db.admin_url()) or "base"


def released_sql(revision: str, name: str, start: str, end: str | None = None) -> str:
    """The part of released ``revision``'s SQL constant ``name`` from ``start`` (included) to
    ``end`` (excluded; the constant's end when None): what a later revision patches or
    restores, and what a benchmark installs beside it. A released revision's bytes are pinned
    by ``db/released.sha256``."""
    script = ScriptDirectory.from_config(alembic_config()).get_revision(revision)
    if script is None:
        raise RuntimeError(f"no revision {revision}")
    text: str = getattr(script.module, name)
    first = text.index(start)
    return text[first:] if end is None else text[first:text.index(end, first)]


def patched(text: str, patches: tuple[tuple[str, str], ...], what: str) -> str:
    """``text`` with each (anchor, replacement) of ``patches`` applied; an anchor that does
    not occur exactly once is an error naming ``what``."""
    for old, new in patches:
        if text.count(old) != 1:
            raise RuntimeError(f"{what} does not hold this text once: {old[:80]!r}")
        text = text.replace(old, new)
    return text
