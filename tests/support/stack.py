"""A whole Engram, as ``make up`` runs it, for the crash and outage tests.

``stack`` (session-scoped, started on first use) makes a fresh ``ENGRAM_HOME`` with its
own embedded server, runs ``engram up`` (database, migrations, the embedding worker and
the derive schedule in threads, the API in front) and a separate ``engram worker run``,
makes a tenant and a development key, and waits until ``/readyz`` says ready. Its
processes log to files the tests read. The tests kill and restart its parts, so it is
its own server and never the session's test database.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, pool, text

from orchestrator.admin import create_scope, create_tenant
from orchestrator.auth.devkey import create_dev_key, mint_token
from orchestrator.config import Settings
from orchestrator.db.engine import Database
from orchestrator.db.server import free_port

ENGRAM = [sys.executable, "-m", "orchestrator.cli.main"]
__all__ = ["Stack", "stack", "wait_for"]
UPSERT = """mutation($p: String!, $b: String!) { upsertDocument(input: {collection: "crash",
  path: $p, title: $p, body: $b, scopes: ["team"]}) { created } }"""
RECALL = 'query($q: String!) { recall(question: $q) { usedTokens evidence { text } } }'


def wait_for(what: str, check: Callable[[], Any], timeout: float = 300, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(every)


@dataclass
class Stack:
    home: Path
    env: dict[str, str]
    settings: Settings
    url: str
    org: str
    tenant: uuid.UUID
    token: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    _admin: Engine | None = None
    closed: bool = False

    @property
    def database(self) -> Database:
        return Database(self.settings)

    @property
    def admin(self) -> Engine:
        if self._admin is None:
            self._admin = create_engine(self.database.admin_url(), poolclass=pool.NullPool)
        return self._admin

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = self.home.parent / f"{name}.log"
        self.logs[name] = log
        with log.open("ab") as sink:
            proc = subprocess.Popen([*ENGRAM, *args], env=self.env, stdout=sink, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def stop_all(self) -> None:
        """SIGTERM every process at once; SIGKILL what is still there after 20 s."""
        procs = [p for p in self.procs.values() if p.poll() is None]
        self.procs.clear()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)

    def post(self, query: str, variables: dict[str, Any], url: str | None = None,
             timeout: float = 120) -> httpx.Response:
        return httpx.post(f"{url or self.url}/graphql", json={"query": query, "variables": variables},
                          headers={"authorization": f"Bearer {self.token}"}, timeout=timeout)

    def ready(self, url: str | None = None) -> tuple[int, dict[str, Any]]:
        try:
            r = httpx.get(f"{url or self.url}/readyz", timeout=10)
        except httpx.TransportError:
            return 0, {}
        return r.status_code, r.json()

    def scalar(self, sql: str, **params: Any) -> Any:
        with self.admin.connect() as conn:
            return conn.execute(text(sql), {"t": self.tenant, **params}).scalar()

    def chunks(self) -> tuple[int, int, int]:
        """(chunks, pending, embedded more than once) of the stack's tenant."""
        with self.admin.connect() as conn:
            row = conn.execute(text(
                "select count(*), count(*) filter (where embed_state = 'pending'), "
                "count(*) filter (where embed_attempts > 1) from sources.chunks where tenant_id = :t"),
                {"t": self.tenant}).one()
        return int(row[0]), int(row[1]), int(row[2])

    def close(self) -> None:
        """Stop every process and the database, and remove the home (once)."""
        if self.closed:
            return
        self.closed = True
        self.stop_all()
        if self._admin is not None:
            self._admin.dispose()
        with contextlib.suppress(Exception):
            self.database.server.stop(timeout=30)
        shutil.rmtree(self.home.parent, ignore_errors=True)

    def postmaster_pid(self) -> int | None:
        return self.database.server.pid()

    def restart_database(self) -> None:
        """Start the server again after a stop or a crash (backends of a killed postmaster
        may hold its shared memory for a moment: retried)."""
        def started() -> bool:
            try:
                self.database.start_embedded()
            except Exception:
                return False
            return True

        wait_for("the database to start again", started, timeout=120, every=1.0)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    tmp = Path(tempfile.mkdtemp(prefix="engram-stack-"))
    tmp.chmod(0o755)
    home = tmp / "home"
    keys = tmp / "keys"
    keys.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(ENGRAM_HOME=str(home), ENGRAM_DB_PORT=str(free_port()), ENGRAM_API_PORT=str(free_port()),
               ENGRAM_DERIVE_INTERVAL_S="3", ENGRAM_WORKER_POLL_S="1",
               ENGRAM_AUTH_DEV_KEY_PATH=str(keys / "dev-key.pem"), ENGRAM_AUTH_TRUST_DEV_KEY="true")
    settings = Settings(home=home, db_port=int(env["ENGRAM_DB_PORT"]),
                        auth_dev_key_path=keys / "dev-key.pem", auth_trust_dev_key=True)
    create_dev_key(settings)
    url = f"http://127.0.0.1:{env['ENGRAM_API_PORT']}"
    s = Stack(home, env, settings, url, "", uuid.uuid4(), "")
    try:
        up = s.start("up", "up")
        wait_for("engram up to migrate and listen",
                 lambda: (up.poll() is None or pytest.fail(s.log("up"))) and s.ready()[0] in (200, 503))
        s.org = f"stack-{uuid.uuid4().hex[:8]}"
        db = Database(settings)
        s.tenant = create_tenant(db, s.org, s.org)
        create_scope(db, s.org, "team", "Everyone")
        s.token = mint_token(settings, tenant=s.org, user="crash-tester", scopes=["write:team"],
                             ttl_s=7200)
        worker = s.start("worker", "worker", "run", "--no-derive")
        wait_for("engram up to be ready", lambda: s.ready()[0] == 200)
        wait_for("the separate worker to listen", lambda: (worker.poll() is None or pytest.fail(
            s.log("worker"))) and "embedding worker: listening" in s.log("worker"))
        _running.append(s)
        yield s
    finally:
        s.close()


# The stack's processes (a derive tick every 3 s, a worker polling every second) would load
# the machine for the rest of the session: it is closed after the last collected test that
# uses it (tests that do not use it may run between those that do).
_running: list[Stack] = []
_last_user: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    users = [item.nodeid for item in items if "stack" in getattr(item, "fixturenames", ())]
    _last_user[:] = users[-1:]


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _running and (nextitem is None or item.nodeid in _last_user):
        while _running:
            _running.pop().close()
