"""Where the database is and how each role connects to it.

Two deployments, one interface:

* **embedded** (default): the cluster under ``ENGRAM_HOME`` managed by
  ``EmbeddedServer``; passwords are generated and kept in ``secrets.json``;
* **external**: ``ENGRAM_DATABASE_URL`` names a role that may run migrations;
  ``engram_app`` connects to the same server and database with
  ``ENGRAM_APP_PASSWORD``.

The application only ever connects as ``engram_app`` (``app_engine``); the admin
URL is used for migrations and DBA tasks, never for requests.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from orchestrator.config import Settings, get_settings
from orchestrator.db.server import EmbeddedServer, ServerStatus
from orchestrator.errors import ServerError

MIN_SERVER_VERSION = 160000
MIN_PGVECTOR = (0, 8)

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "db"


def _normalise(url: str) -> str:
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


class Database:
    """Connection facts for one Engram database."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()

    @property
    def external(self) -> bool:
        return bool(self.settings.database_url)

    @cached_property
    def server(self) -> EmbeddedServer:
        return EmbeddedServer(self.settings)

    def start_embedded(self) -> ServerStatus:
        """Start the embedded server and make sure Engram's database exists in it."""
        status = self.server.start()
        self.server.ensure_database(self.settings.db_name)
        return status

    def admin_url(self) -> str:
        if self.settings.database_url:
            return _normalise(self.settings.database_url)
        return self.server.url()

    def role_url(self, role: str) -> str:
        """URL for ``engram_app``, ``engram_auditor`` or ``engram_worker`` on the same server."""
        if not self.external:
            return self.server.url(role)
        password = self._configured_passwords().get(role)
        if not password:
            raise ServerError(
                f"ENGRAM_DATABASE_URL is set but no password for {role} is configured; set "
                f"ENGRAM_{role.removeprefix('engram_').upper()}_PASSWORD"
            )
        base = make_url(self.admin_url())
        return base.set(username=role, password=password).render_as_string(hide_password=False)

    def _configured_passwords(self) -> dict[str, str | None]:
        """The ``ENGRAM_*_PASSWORD`` settings of the login roles (external servers)."""
        return {
            "engram_app": self.settings.app_password,
            "engram_auditor": self.settings.auditor_password,
            "engram_worker": self.settings.worker_password,
        }

    def app_url(self) -> str:
        return self.role_url("engram_app")

    def psql_url(self, role: str | None = None, *, hide_password: bool = False) -> str:
        """A libpq URL for ``role`` (the administrator by default); ``hide_password`` writes
        ``***`` for the password, for output that ends up in logs."""
        url = self.admin_url() if role is None else self.role_url(role)
        return make_url(url).set(drivername="postgresql").render_as_string(
            hide_password=hide_password)

    def set_role_passwords(self) -> None:
        """Give the login roles their passwords: generated (embedded) or configured (external).

        On an external server a role whose ``ENGRAM_*_PASSWORD`` is not set keeps
        whatever password its DBA gave it.
        """
        if self.external:
            secrets = {role: pw for role, pw in self._configured_passwords().items() if pw}
        else:
            secrets = self.server.secrets()
        engine = create_engine(self.admin_url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                for role in ("engram_app", "engram_auditor", "engram_worker"):
                    if role not in secrets:
                        continue
                    # A role a later revision creates may not exist yet at this revision.
                    stmt = conn.execute(text(
                        "select format('alter role %I password %L', cast(:r as text), "
                        "cast(:pw as text)) from pg_roles where rolname = :r"
                    ), {"r": role, "pw": secrets[role]}).scalar()
                    if stmt is not None:
                        conn.exec_driver_sql(stmt)
        finally:
            engine.dispose()

    def check_server(self) -> str:
        """Refuse servers older than PostgreSQL 16 or without pgvector >= 0.8."""
        engine = create_engine(self.admin_url())
        try:
            with engine.connect() as conn:
                version = int(conn.execute(text("show server_version_num")).scalar_one())
                pgv = conn.execute(text(
                    "select default_version from pg_available_extensions where name = 'vector'"
                )).scalar()
        finally:
            engine.dispose()
        if version < MIN_SERVER_VERSION:
            raise ServerError(f"PostgreSQL {version // 10000} is too old; Engram needs 16 or newer")
        if pgv is None:
            raise ServerError("the server has no pgvector extension; Engram needs pgvector >= 0.8")
        parts = tuple(int(p) for p in str(pgv).split(".")[:2])
        if parts < MIN_PGVECTOR:
            raise ServerError(f"pgvector {pgv} is too old; Engram needs 0.8 or newer")
        return f"PostgreSQL {version // 10000}.{version % 10000}, pgvector {pgv}"


def make_app_engine(url: str, *, pool_size: int = 10, max_overflow: int | None = None) -> Engine:
    """An engine for ``engram_app``; refuses to run if the role could bypass RLS.

    ``max_overflow`` (default ``pool_size``): connections opened past the pool when it is
    busy, closed again when returned. A closed connection takes its prepared recall
    statements with it, so a server sizes the pool for its steady load (``engram serve``).

    The pool hands out the connection returned last (LIFO): each connection plans the recall
    statement of a size class once, at its first recall of that class (about 30-50 ms on a
    fresh server process), so at light load the same few warm connections serve every
    recall, where FIFO rotated through all of them and each paid its plan in turn."""
    engine = create_engine(url, pool_size=pool_size,
                           max_overflow=pool_size if max_overflow is None else max_overflow,
                           pool_pre_ping=True, pool_use_lifo=True)

    @event.listens_for(engine, "connect")
    def _check_role(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        cur = dbapi_conn.cursor()
        cur.execute(
            "select rolsuper or rolbypassrls from pg_roles where rolname = current_user"
        )
        row = cur.fetchone()
        cur.close()
        dbapi_conn.commit()
        if row is None or row[0]:
            raise ServerError("refusing an application connection that could bypass row level security")

    from orchestrator.inputs import guard_engine

    return guard_engine(engine)
