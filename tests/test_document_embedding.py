"""Over GraphQL: a document's embedding progress is true (a client waiting for "embedded"
sees it), and a document's time (occurredAt) reaches the timeline lane as front matter does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orchestrator.config import Settings
from orchestrator.db.engine import make_app_engine
from orchestrator.recall import Recaller
from orchestrator.worker.embedder import Embedder
from orchestrator.worker.queue import QueueWorker
from tests.conftest import TenantFixture, TestDatabase
from tests.support.api import ApiServer, api_home, api_server, error_of  # noqa: F401

Tenants = Callable[..., TenantFixture]

PROGRESS = """query($c: String!, $p: String!) { document(collection: $c, path: $p) {
    occurredAt embedding { state chunksTotal chunksEmbedded chunksFailed } } }"""
UPSERT = """mutation($i: DocumentInput!) { upsertDocument(input: $i) {
    chunks document { occurredAt embedding { state chunksTotal chunksEmbedded } } } }"""


class Poisoned:
    """The real embedder, refusing any text that contains a marker (no real text fails)."""

    def __init__(self, inner: Embedder, marker: str) -> None:
        self.inner = inner
        self.model_name = inner.model_name
        self.dimension = inner.dimension
        self.marker = marker

    def embed_passages(self, texts: Sequence[str]) -> Any:
        if any(self.marker in t for t in texts):
            raise ValueError("this text cannot be embedded")
        return self.inner.embed_passages(texts)


@pytest.fixture(scope="module")
def worker_engine(test_db: TestDatabase) -> Any:
    engine = make_app_engine(test_db.database.role_url("engram_worker"), pool_size=2)
    yield engine
    engine.dispose()


def _body(topic: str, n: int = 3) -> str:
    return "\n\n".join(f"Section {i} about {topic}. " + "The details go on here. " * 45
                       for i in range(n))


@pytest.mark.slow
def test_a_client_waiting_for_embedded_sees_it(api_server: ApiServer,  # noqa: F811
                                               tenant_factory: Tenants,
                                               worker_engine: Engine) -> None:
    t = tenant_factory("team")
    token = api_server.token(t.org_id, "alice", ("write:team",))
    written = api_server.gql(token, UPSERT, {"i": {
        "collection": "notes", "path": "long.md", "title": "Long", "body": _body("gardens"),
        "scopes": ["team"]}})["upsertDocument"]
    assert written["chunks"] >= 2
    assert written["document"]["embedding"] == {
        "state": "pending", "chunksTotal": written["chunks"], "chunksEmbedded": 0}

    seen: list[dict[str, Any]] = []

    def client() -> None:
        # What a client does: ask until the document says it is embedded.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            doc = api_server.gql(token, PROGRESS, {"c": "notes", "p": "long.md"})["document"]
            seen.append(doc["embedding"])
            if doc["embedding"]["state"] != "pending":
                return
            time.sleep(0.2)

    waiting = threading.Thread(target=client)
    waiting.start()
    while not seen:
        time.sleep(0.05)
    embedder = Embedder.from_settings(Settings())
    QueueWorker(worker_engine, embedder, Settings(), tenants=[t.id]).drain()
    waiting.join(timeout=150)
    assert seen[0]["state"] == "pending"
    assert seen[-1] == {"state": "embedded", "chunksTotal": written["chunks"],
                        "chunksEmbedded": written["chunks"], "chunksFailed": 0}

    # A chunk the model cannot embed fails for good: the document says so and waits no more.
    api_server.gql(token, UPSERT, {"i": {
        "collection": "notes", "path": "poisoned.md", "title": "Poisoned",
        "body": _body("roses", 2) + "\n\nPOISON " + "more words here. " * 60, "scopes": ["team"]}})
    QueueWorker(worker_engine, Poisoned(embedder, "POISON"),
                Settings(worker_max_attempts=1, worker_backoff_s=0.01), tenants=[t.id]).drain()
    progress = api_server.gql(token, PROGRESS, {"c": "notes", "p": "poisoned.md"})["document"]
    assert progress["embedding"]["state"] == "failed"
    assert progress["embedding"]["chunksFailed"] == 1
    assert progress["embedding"]["chunksEmbedded"] == progress["embedding"]["chunksTotal"] - 1


def test_occurred_at_over_graphql_reaches_the_timeline_lane(
        api_server: ApiServer, tenant_factory: Tenants, app_engine: Engine,  # noqa: F811
        admin_engine: Engine) -> None:
    t = tenant_factory("team")
    token = api_server.token(t.org_id, "alice", ("write:team",))
    days = {1: "Planted tomatoes along the fence.", 2: "The heron came back to the pond.",
            3: "Harvested the first courgettes."}
    for day, body in days.items():
        doc = api_server.gql(token, UPSERT, {"i": {
            "collection": "journal", "path": f"day{day}.md", "title": f"Journal day {day}",
            "body": body, "scopes": ["team"],
            "occurredAt": f"2026-05-0{day}T08:00:00+02:00"}})["upsertDocument"]["document"]
        assert doc["occurredAt"] == f"2026-05-0{day}T06:00:00+00:00"
    identity = t.identity("alice", write=("team",))
    _, trace = Recaller(app_engine, api_server.settings).trace(identity, "Did the heron come back?")
    # Day 2 is found by its words; its neighbours in time come in through the timeline lane,
    # which orders the collection by occurred_at: written over GraphQL, they now have one.
    assert {it.label.split(" #")[0] for it in trace.pools["timeline"]} == {"Journal day 1",
                                                                           "Journal day 3"}

    # A time without a zone, or no time at all, is refused and writes nothing.
    for bad, says in (("2026-05-04T08:00:00", "has no time zone"),
                      ("the fourth of May", "is not an ISO 8601 date and time")):
        response = api_server.post(token, UPSERT, {"i": {
            "collection": "journal", "path": "day4.md", "title": "Journal day 4", "body": "x",
            "scopes": ["team"], "occurredAt": bad}})
        error = error_of(response)
        assert error["extensions"]["code"] == "BAD_USER_INPUT" and says in error["message"], error
    with admin_engine.connect() as conn:
        assert conn.execute(text("select count(*) from sources.documents where tenant_id = :t"),
                            {"t": t.id}).scalar_one() == 3
