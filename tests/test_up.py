"""``engram up`` (what ``make up`` runs) on a fresh home: database, migrations, embedding
worker, derive jobs and the API in one process, driven the way the README's quickstart
drives it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from orchestrator.db.server import free_port
from tests.support.stack import wait_for

ENGRAM = [sys.executable, "-m", "orchestrator.cli.main"]


@pytest.fixture
def fresh() -> Iterator[dict[str, str]]:
    # Not pytest's tmp_path: under root the server runs as an unprivileged user that must
    # reach its data directory.
    tmp = Path(tempfile.mkdtemp(prefix="engram-up-"))
    tmp.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(ENGRAM_HOME=str(tmp / "home"), ENGRAM_DB_PORT=str(free_port()),
               ENGRAM_API_PORT=str(free_port()), ENGRAM_DERIVE_INTERVAL_S="2",
               ENGRAM_AUTH_DEV_KEY_PATH=str(tmp / "dev-key.pem"))
    yield env
    subprocess.run([*ENGRAM, "db", "stop"], env=env, capture_output=True, check=False, timeout=120)
    shutil.rmtree(tmp, ignore_errors=True)


def run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([*ENGRAM, *args], env=env, capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


@pytest.mark.slow
def test_engram_up_runs_database_worker_derive_and_api(fresh: dict[str, str]) -> None:
    log = Path(fresh["ENGRAM_HOME"]).parent / "up.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([*ENGRAM, "up"], env=fresh, stdout=sink, stderr=subprocess.STDOUT,
                                text=True)
    url = f"http://127.0.0.1:{fresh['ENGRAM_API_PORT']}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for("the API", healthy)
        # It says how to connect as the application role, without the role's password (its
        # output is a service's log); `engram db url` prints the whole URL on request.
        full = run(fresh, "db", "url").strip()
        password = make_url(full).password
        assert password and password not in log.read_text()
        assert make_url(full).render_as_string(hide_password=True) in log.read_text()
        run(fresh, "admin", "create-tenant", "acme", "--name", "Acme")
        run(fresh, "admin", "create-scope", "acme", "team", "--description", "Everyone at Acme")
        run(fresh, "auth", "dev-key")
        token = run(fresh, "auth", "token", "--tenant", "acme", "--user", "alice", "--scopes",
                    "read:team,write:team").strip().splitlines()[-1]
        headers = {"authorization": f"Bearer {token}"}

        def gql(query: str, variables: dict[str, Any] | None = None) -> Any:
            body = httpx.post(f"{url}/graphql", json={"query": query, "variables": variables or {}},
                              headers=headers, timeout=60).json()
            assert "errors" not in body, body
            return body["data"]

        gql("""mutation { upsertDocument(input: {collection: "notes", path: "kyoto.md",
            title: "Kyoto trip", body: "Maria Lopez booked the ryokan in Kyoto for April.",
            scopes: ["team"]}) { created } }""")
        # The worker embeds the chunk: a question sharing no word with it finds it by meaning.
        question = "Which lodging did someone reserve in Japan?"

        def found() -> bool:
            r = gql("query($q: String!) { recall(question: $q) { evidence { text } } }", {"q": question})
            return any("ryokan" in e["text"] for e in r["recall"]["evidence"])

        wait_for("the worker to embed the chunk", found)
        # The derive jobs extract entities from it in the background, as service:derive.
        entity = wait_for("the derive jobs to extract an entity", lambda: gql(
            'query { entity(type: "person", name: "Maria Lopez") }')["entity"])
        assert entity
        assert "derive jobs every 2s" in log.read_text()
        # The console is on the same server, and `engram up` says where.
        assert f"Console on {url}/console" in log.read_text()
        assert "Sign in" in httpx.get(f"{url}/console/signin", timeout=30).text
        # The scheduler's runs reach a DBA through GraphQL (deriveRuns), newest first.
        dba = run(fresh, "auth", "token", "--tenant", "acme", "--user", "dora", "--scopes",
                  "read:team,engram:dba").strip().splitlines()[-1]
        runs = httpx.post(f"{url}/graphql", json={"query": "{ deriveRuns { job ok source } }"},
                          headers={"authorization": f"Bearer {dba}"}, timeout=60).json()
        assert {"extract", "scheduler"} <= {v for r in runs["data"]["deriveRuns"]
                                            for v in (r["job"], r["source"])}, runs
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # Stopped: it says the database it started keeps running, and it does.
    assert "embedded database keeps running (`engram db stop` stops it)" in log.read_text()
    assert "running" in run(fresh, "db", "status")
