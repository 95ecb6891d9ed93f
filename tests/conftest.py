"""Shared fixtures: one real PostgreSQL per test session, migrated once.

Where the server comes from, in order:

1. ``ENGRAM_TEST_DATABASE_URL``: an external server (an admin URL; the test
   database named in it is migrated to head and used as is);
2. ``--containers`` with a Docker engine: the ``docker/`` PostgreSQL image via
   testcontainers (skipped cleanly when no engine exists);
3. otherwise the embedded server, in a temporary ``ENGRAM_HOME`` on a free port
   (the default, and what CI uses).

Tests that need several connections to see the same rows commit their data, so
each test works in its own tenant (``tenant_factory`` makes a fresh one with a
unique organization id) rather than in a rolled-back transaction.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.engine import Database, make_app_engine
from orchestrator.db.server import free_port

REPO = Path(__file__).resolve().parents[1]
TEST_DB = "engram_test"
# Session fixtures shared by several modules (a fixture imported into two modules is two fixtures).
pytest_plugins = ["tests.support.stack"]


@pytest.fixture(autouse=True)
def _engram_logger_restored() -> Iterator[None]:
    """A command a test runs in-process (``CliRunner``: ``engram worker run``, ``up``) sets up
    the ``engram`` logger for the whole process, as it does for a real one; put it back after
    the test, so the next test's command output holds no log lines of an earlier command."""
    logger = logging.getLogger("engram")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--containers", action="store_true",
                     help="run against the docker/ PostgreSQL image via testcontainers")


@dataclass
class TestDatabase:
    __test__ = False

    settings: Settings
    database: Database
    admin_url: str
    psql_url: str
    kind: str
    home: Path | None = None
    _engines: list[Engine] = field(default_factory=list)

    def engine(self, url: str, **kw: object) -> Engine:
        eng = create_engine(url, **kw)  # type: ignore[arg-type]
        self._engines.append(eng)
        return eng

    def dispose(self) -> None:
        for eng in self._engines:
            eng.dispose()


def _containers_db(tmp: Path) -> tuple[Settings, Any]:
    """The docker/ PostgreSQL image (built from docker/postgres.Dockerfile unless
    ENGRAM_TEST_IMAGE names one) started through testcontainers; the caller stops it."""
    import docker  # type: ignore[import-not-found]

    if not hasattr(docker, "from_env"):  # the repo's docker/ folder, not the SDK
        pytest.skip("--containers needs the containers extra: pip install -e '.[containers]'")
    try:
        docker.from_env().ping()
    except Exception as exc:  # no engine on this machine
        pytest.skip(f"--containers given but no Docker engine is reachable: {exc}")
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]

    image = os.environ.get("ENGRAM_TEST_IMAGE")
    if not image:
        from testcontainers.core.image import DockerImage  # type: ignore[import-not-found]

        image = "engram-postgres:test"
        DockerImage(path=str(REPO / "docker"), dockerfile_path="postgres.Dockerfile", tag=image,
                    clean_up=False).build()
    container = PostgresContainer(image, driver="psycopg")
    container.start()
    url = container.get_connection_url()
    return Settings(home=tmp, database_url=url, app_password="engram-test", worker_password="engram-test",
                    auditor_password="engram-test"), container


@pytest.fixture(scope="session")
def test_db(request: pytest.FixtureRequest) -> Iterator[TestDatabase]:
    external = os.environ.get("ENGRAM_TEST_DATABASE_URL")
    tmp = Path(tempfile.mkdtemp(prefix="engram-test-"))
    tmp.chmod(0o755)
    home = tmp / "home"
    container: Any = None
    if external:
        # migrate() gives the login roles these configured passwords.
        password = os.environ.get("ENGRAM_TEST_APP_PASSWORD", "engram-test")
        settings = Settings(home=home, database_url=external, app_password=password,
                            auditor_password=password, worker_password=password)
        kind = "external"
    elif request.config.getoption("--containers"):
        settings, container = _containers_db(home)
        kind = "containers"
    else:
        settings = Settings(home=home, db_port=free_port(), db_name=TEST_DB)
        kind = "embedded"
    db = Database(settings)
    if kind == "embedded":
        db.server.start()
    from orchestrator.db.migrate import migrate

    migrate(db)
    tdb = TestDatabase(settings, db, db.admin_url(), db.psql_url(), kind, home)
    try:
        yield tdb
    finally:
        from orchestrator.recall.service import close_background

        close_background()  # recalls' receipts and access counts, before the server stops
        tdb.dispose()
        if container is not None:
            container.stop()
        if kind == "embedded":
            try:
                db.server.stop()
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def admin_engine(test_db: TestDatabase) -> Engine:
    """The migrating superuser: for fixtures and tamper tests only, never for app paths."""
    return test_db.engine(test_db.admin_url)


@pytest.fixture(scope="session")
def app_engine(test_db: TestDatabase) -> Engine:
    eng = make_app_engine(test_db.database.app_url())
    test_db._engines.append(eng)
    return eng


@dataclass(frozen=True)
class TenantFixture:
    org_id: str
    id: uuid.UUID
    scopes: dict[str, uuid.UUID]

    def identity(self, user: str = "alice", *, read: tuple[str, ...] = (),
                 write: tuple[str, ...] = ()) -> Identity:
        return Identity.of(self.org_id, user, read=read, write=write)


@pytest.fixture(scope="session")
def tenant_factory(admin_engine: Engine) -> Callable[..., TenantFixture]:
    """Make a fresh tenant with the given scopes (committed, unique org id).

    Session-scoped because it holds no state: every call makes a new tenant, so
    module fixtures that build a corpus once can use it too.
    """

    def make(*scopes: str, org_prefix: str = "org") -> TenantFixture:
        org = f"{org_prefix}-{uuid.uuid4().hex[:12]}"
        with admin_engine.begin() as conn:
            conn.execute(text("set local role engram_dba"))
            tid = conn.execute(text("select auth.create_tenant(:o, :n)"),
                               {"o": org, "n": org}).scalar_one()
            ids = {}
            for name in scopes or ("team",):
                ids[name] = conn.execute(
                    text("select auth.create_scope(:t, :n, :d)"),
                    {"t": tid, "n": name, "d": f"The {name} scope"},
                ).scalar_one()
        return TenantFixture(org, tid, ids)

    return make


@pytest.fixture(scope="session")
def settings(test_db: TestDatabase) -> Settings:
    return test_db.settings


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.test_pgtap import RESULTS

    if not RESULTS:
        return
    planned = sum(r.planned or 0 for r in RESULTS.values())
    passed = sum(r.passed for r in RESULTS.values())
    failed = sum(len(r.failed) for r in RESULTS.values())
    terminalreporter.write_sep("=", "pgTAP")
    for name, r in sorted(RESULTS.items()):
        terminalreporter.write_line(
            f"{name}: {r.passed}/{r.planned} ok" + (f", {len(r.failed)} not ok" if r.failed else "")
        )
    terminalreporter.write_line(
        f"pgTAP: {len(RESULTS)} files, {planned} planned, {passed} passed, {failed} failed"
    )
