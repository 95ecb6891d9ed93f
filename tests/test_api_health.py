"""``/healthz`` and ``/readyz`` of the API, and what it answers when the database is out of reach.

A real uvicorn server (``tests.support.api.serve``) per case. The database "out of
reach" is an application engine pointed at a port where nothing listens: the same
refused connection a stopped server gives, without stopping the session's server
(the full restart under ``engram up`` is ``tests/adversarial/test_outage.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.server.mcpserver.exceptions import ToolError as SdkToolError
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from orchestrator.api.health import Warmup
from orchestrator.api.mcp import build_server
from orchestrator.auth.devkey import create_dev_key, mint_token
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.client import Engram
from orchestrator.config import Settings
from orchestrator.db.engine import make_app_engine
from orchestrator.db.server import free_port
from orchestrator.errors import Unavailable
from orchestrator.health import Health
from orchestrator.recall import Recaller
from orchestrator.recall.ranker import default_model
from orchestrator.worker.registry import ModelMismatch
from tests.conftest import TenantFixture, TestDatabase
from tests.support.api import api_settings, serve
from tests.support.recall import doc, embedder, write_documents

__all__ = ["embedder"]  # a fixture

RECALL = 'query { recall(question: "where is the lighthouse?") { usedTokens } }'
UPSERT = """mutation { upsertDocument(input: {collection: "n", path: "h.md", title: "h", body: "b",
  scopes: ["team"]}) { created } }"""


@pytest.fixture(scope="module")
def health_settings(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    s = api_settings(settings, tmp_path_factory.mktemp("health-home"))
    create_dev_key(s)
    return s


@pytest.fixture
def dead_engine(test_db: TestDatabase) -> Iterator[Engine]:
    """engram_app's URL with the port of nothing at all."""
    url = make_url(test_db.database.app_url()).set(port=free_port())
    engine = make_app_engine(url.render_as_string(hide_password=False), pool_size=2)
    yield engine
    engine.dispose()


def ready(url: str) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{url}/readyz", timeout=30)
    return response.status_code, response.json()


def test_readyz_waits_for_the_models_then_says_ready(health_settings: Settings,
                                                     app_engine: Engine,
                                                     tenant_factory: Any,
                                                     embedder: Any) -> None:
    recaller = Recaller(app_engine, health_settings)
    warmup = Warmup()
    with serve(health_settings, app_engine, recaller=recaller, warmup=warmup) as server:
        url = server.url
        assert httpx.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
        status, body = ready(url)
        assert status == 503 and body["ready"] is False
        assert body["database"]["ok"] is True
        assert body["models"] == {"ok": False, "state": "not started"}

        default_model.cache_clear()  # whatever an earlier test loaded
        warmup.run(recaller)
        status, body = ready(url)
        assert status == 200 and body["ready"] is True, body
        assert default_model.cache_info().currsize == 1  # the first recall will not load it
        assert body["models"]["state"] == "loaded"
        # Every stage of a recall ran once: the query model, the statement, the tail and the
        # ranking tail (the ranker model loaded).
        assert {"models", "statement", "tail", "ranker"} <= set(warmup.stages_ms)
        assert body["components"] == {}
        assert body["issuers"][health_settings.auth_dev_issuer]["state"] == "ok"
        # The recall background's failure counters: shown, process totals, never a tenant.
        assert set(body["bookkeeping"]) == {
            "chain_failures", "access_counts_dropped", "usage_rows_dropped",
            "usage_rows_poisoned"}
        assert all(isinstance(v, int) and v >= 0 for v in body["bookkeeping"].values())
        recaller.usage.poisoned += 2  # as two refused events would have counted
        assert ready(url)[1]["bookkeeping"]["usage_rows_poisoned"] == \
            body["bookkeeping"]["usage_rows_poisoned"] + 2
        # Anyone may ask /readyz: a tenant's recalls (a receipt, usage rows written) show
        # nothing there, so the endpoint tells no one how much anybody recalls.

        t = tenant_factory("team")
        alice = t.identity("alice", write=("team",))
        write_documents(app_engine, alice, embedder,
                        [doc("l.md", "Lighthouse", "The lighthouse keeper logs the weather.")],
                        health_settings)
        before = ready(url)[1]["bookkeeping"]
        result, trace = recaller.trace(alice, "who logs the weather?")
        assert result.evidence and trace.receipt_id is not None and trace.usage_rows > 0
        recaller.settle()
        assert recaller.usage.written >= 1
        after = ready(url)[1]
        assert after["bookkeeping"] == before
        assert t.org_id not in str(after) and str(t.id) not in str(after)


def test_a_dead_or_reconnecting_component_makes_the_server_not_ready(
        health_settings: Settings, app_engine: Engine) -> None:
    recaller = Recaller(app_engine, health_settings)
    recaller.warmed = True  # the models are not what this case is about
    health = Health()
    worker = health.component("embedding worker")
    derive = health.component("derive schedule")
    with serve(health_settings, app_engine, recaller=recaller, health=health) as server:
        url = server.url
        status, body = ready(url)
        assert status == 503 and body["components"]["embedding worker"]["state"] == "starting"
        worker.ok("listening")
        derive.off("off (ENGRAM_DERIVE_INTERVAL_S is 0)")
        status, body = ready(url)
        assert status == 200, body

        worker.retrying(Unavailable(detail="connection refused"), 2.0)
        status, body = ready(url)
        assert status == 503
        shown = body["components"]["embedding worker"]
        assert shown["state"] == "reconnecting" and shown["failures"] == 1
        assert "the database is unavailable: the connection was refused" in shown["detail"]

        # /readyz answers anyone: a failure shows its type, never its message (a row the
        # database refused may be quoted there); the log keeps the message.
        worker.retrying(ValueError('invalid input: "alice\'s salary is 91,000"'), 2.0)
        status, body = ready(url)
        shown = body["components"]["embedding worker"]
        assert status == 503 and shown["state"] == "failing"
        assert shown["detail"] == "ValueError (the process log says why); next try in 2.0 s"
        assert "salary" in worker.detail and "salary" not in str(body)

        worker.dead(RuntimeError("the active embedding model changed"))
        status, body = ready(url)
        assert status == 503
        assert body["components"]["embedding worker"]["state"] == "dead"
        assert body["components"]["embedding worker"]["detail"] == \
            "RuntimeError (the process log says why)"
        worker.dead(ModelMismatch("the active embedding model changed"))  # our own words
        assert "the active embedding model changed" in \
            ready(url)[1]["components"]["embedding worker"]["detail"]
        assert body["components"]["derive schedule"]["state"] == "off"

        # Volumes stay in the log: how much a process embeds tells how much its tenants write.
        worker.ok("listening; the last drain embedded 40 rows")
        shown = ready(url)[1]["components"]["embedding worker"]
        assert shown["state"] == "ok" and shown["detail"] == ""
        assert "drain" not in str(shown) and "40 rows" not in str(shown)
        # Nor when it last drained (a write's time): last_ok_at only once it is not ok.
        assert shown["last_ok_at"] is None and worker.last_ok_at is not None
        worker.retrying(Unavailable(detail="connection refused"), 2.0)
        assert ready(url)[1]["components"]["embedding worker"]["last_ok_at"] == \
            worker.last_ok_at.isoformat()


def test_a_database_out_of_reach_is_unavailable_and_names_no_host(
        health_settings: Settings, dead_engine: Engine, tenant_factory: Callable[..., TenantFixture]
) -> None:
    t = tenant_factory("team")
    port = str(make_url(str(dead_engine.url)).port)
    token = mint_token(health_settings, tenant=t.org_id, user="alice", scopes=["write:team"])
    recaller = Recaller(dead_engine, health_settings)
    recaller.warmed = True
    with serve(health_settings, dead_engine, recaller=recaller) as server:
        url = server.url
        status, body = ready(url)
        assert status == 503 and body["database"]["ok"] is False
        assert body["database"]["detail"] == "the database is unavailable: the connection was refused"
        for query in (RECALL, UPSERT):
            response = httpx.post(f"{url}/graphql", json={"query": query},
                                  headers={"authorization": f"Bearer {token}"}, timeout=60)
            # Before: 403 FORBIDDEN carrying the driver's 'connection to server at "127.0.0.1",
            # port ... failed'.
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "2"
            error = response.json()["errors"][0]
            assert error["extensions"]["code"] == "UNAVAILABLE"
            assert error["message"] == Unavailable.MESSAGE
            assert "127.0.0.1" not in response.text and port not in response.text

    # MCP: the same code, in the tool error's text.
    verifier = TokenVerifier.from_settings(health_settings)
    server = build_server(lambda: Engram(dead_engine, token, health_settings, verifier=verifier,
                                         recaller=recaller, channel="mcp"))

    async def call() -> str:
        try:
            await server.call_tool("search_documents", {})
        except SdkToolError as exc:
            return str(exc)
        return "no error"

    said = anyio.run(call)
    assert said.endswith(f": UNAVAILABLE: {Unavailable.MESSAGE}"), said


def test_the_cli_says_unavailable_without_a_traceback(health_settings: Settings,
                                                      tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(ENGRAM_HOME=str(tmp_path / "home"), ENGRAM_AUTH_DEV_KEY_PATH=str(
        health_settings.auth_dev_key_path), ENGRAM_AUTH_TRUST_DEV_KEY="true",
        ENGRAM_DATABASE_URL=f"postgresql://engram:x@127.0.0.1:{free_port()}/engram",
        ENGRAM_APP_PASSWORD="x", ENGRAM_AUDITOR_PASSWORD="x")
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "audit", "verify"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 75, done.stderr
    assert "the database is unavailable" in done.stderr and "(UNAVAILABLE)" in done.stderr
    assert "Traceback" not in done.stderr and "127.0.0.1" not in done.stderr
