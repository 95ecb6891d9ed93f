"""The embedding queue on a real server with the real packaged model.

Model calls are counted by a wrapper that records every text handed to the real
embedder; that is how "no row embedded twice" and "identical texts cost one
call" are checked. The poisoned-row test adds one fault to that wrapper (a text
the wrapper refuses), because no real text makes MiniLM fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, text

from orchestrator.config import Settings
from orchestrator.db.engine import make_app_engine
from orchestrator.worker.embedder import Embedder
from orchestrator.worker.queue import EMBEDDABLE, ModelMismatch, QueueWorker
from tests.conftest import TestDatabase
from tests.support.worker import WorkerDatabase, worker_db

__all__ = ["worker_db"]

pytestmark = pytest.mark.slow


class Recording:
    """The real embedder, with every text it is asked to embed recorded."""

    def __init__(self, inner: Embedder, poison: str | None = None,
                 model_name: str | None = None) -> None:
        self.inner = inner
        self.model_name = model_name or inner.model_name
        self.dimension = inner.dimension
        self.poison = poison
        self.texts: list[str] = []
        self.calls = 0
        self._lock = threading.Lock()

    def embed_passages(self, texts: Sequence[str]) -> Any:
        with self._lock:
            self.calls += 1
        if self.poison is not None and any(self.poison in t for t in texts):
            raise ValueError(f"cannot embed a text containing {self.poison!r}")
        vectors = self.inner.embed_passages(texts)
        with self._lock:
            self.texts.extend(texts)
        return vectors


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder.from_settings(Settings())


@pytest.fixture
def worker_engine(worker_db: WorkerDatabase) -> Any:
    engine = make_app_engine(worker_db.worker_url, pool_size=2)
    yield engine
    engine.dispose()


def _settings(**kw: Any) -> Settings:
    base: dict[str, Any] = {"worker_batch_rows": 64, "worker_backoff_s": 0.05,
                            "worker_max_attempts": 3, "worker_poll_s": 0.5}
    base.update(kw)
    return Settings(**base)


def test_two_workers_drain_2000_chunks_without_embedding_any_twice(
        worker_db: WorkerDatabase, embedder: Embedder) -> None:
    tenant = worker_db.make_tenant()
    texts = [f"note {i}: the {i % 7}th shelf holds item {i * 37 % 1000}" for i in range(2000)]
    worker_db.add_chunks(tenant, texts)
    recorders = [Recording(embedder), Recording(embedder)]
    engines = [make_app_engine(worker_db.worker_url, pool_size=2) for _ in recorders]
    workers = [QueueWorker(e, r, _settings(worker_batch_rows=50), tenants=[tenant])
               for e, r in zip(engines, recorders, strict=True)]
    reports: list[Any] = [None, None]

    def go(i: int) -> None:
        reports[i] = workers[i].drain()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    for e in engines:
        e.dispose()

    embedded = recorders[0].texts + recorders[1].texts
    assert len(embedded) == 2000, "every text reached the model exactly once in total"
    assert set(embedded) == set(texts)
    assert all(r.rows > 0 for r in reports), "both workers took part"
    assert sum(r.rows for r in reports) == 2000
    states = worker_db.states(tenant)
    assert {(s[1], s[2], s[3]) for s in states} == {("ready", 1, embedder.model_name)}
    with worker_db.admin.connect() as conn:
        row = conn.execute(text(
            "select text, embedding::text from sources.chunks where tenant_id = :t "
            "and ordinal = 1234"), {"t": tenant}).one()
    stored = np.array([float(x) for x in row[1].strip("[]").split(",")], dtype=np.float32)
    direct = embedder.embed_passages([row[0]])[0]
    assert float(stored @ direct) > 0.999, "the stored vector is the model's vector of that text"


def test_identical_texts_cost_one_model_call_per_tenant(
        worker_db: WorkerDatabase, worker_engine: Engine, embedder: Embedder) -> None:
    a, b = worker_db.make_tenant(), worker_db.make_tenant()
    same = "the quarterly report is due on Friday"
    worker_db.add_chunks(a, [same] * 30)
    worker_db.add_chunks(a, [same, "something else entirely"])
    worker_db.add_chunks(b, [same])
    rec = Recording(embedder)
    report = QueueWorker(worker_engine, rec, _settings(), tenants=[a, b]).drain()
    assert sorted(rec.texts) == sorted([same, "something else entirely", same]), (
        "one call per distinct text and tenant: the cache is per tenant")
    assert report.rows == 33
    assert report.model_texts == 3, "rows of one batch that share a hash share one vector"

    # A later chunk with a known text, and a re-queued one, cost no model call at all.
    worker_db.add_chunks(a, [same])
    with worker_db.admin.begin() as conn:
        conn.execute(text("update sources.chunks set embed_state = 'pending', embedding = null "
                          "where tenant_id = :t and text = 'something else entirely'"), {"t": a})
    rec2 = Recording(embedder)
    report2 = QueueWorker(worker_engine, rec2, _settings(), tenants=[a]).drain()
    assert rec2.texts == []
    assert report2.rows == 2 and report2.cache_hits == 2
    assert {s[1] for s in worker_db.states(a)} == {"ready"}


def test_poisoned_row_is_marked_failed_and_the_rest_complete(
        worker_db: WorkerDatabase, worker_engine: Engine, embedder: Embedder) -> None:
    tenant = worker_db.make_tenant()
    texts = [f"healthy text number {i}" for i in range(40)]
    texts.insert(17, "this one is POISON for the model")
    worker_db.add_chunks(tenant, texts)
    rec = Recording(embedder, poison="POISON")
    report = QueueWorker(worker_engine, rec, _settings(worker_batch_rows=16),
                         tenants=[tenant]).drain()
    states = {s[0]: s for s in worker_db.states(tenant)}
    bad = states.pop("this one is POISON for the model")
    assert bad[1] == "failed"
    assert bad[2] == 3, "tried the configured number of times"
    assert bad[4] is not None and "POISON" in bad[4], "the row keeps its error"
    assert {s[1] for s in states.values()} == {"ready"}
    assert report.failed == 1 and report.retried == 2
    with worker_db.admin.connect() as conn:
        left = conn.execute(text("select count(*) from worker.embed_retries where tenant_id = :t"),
                            {"t": tenant}).scalar_one()
    assert left == 0, "a row that failed for good leaves no retry behind"


def test_a_bulk_write_does_not_hold_back_other_tenants_or_documents(
        worker_db: WorkerDatabase, worker_engine: Engine, embedder: Embedder) -> None:
    """One batch serves every tenant with pending rows, and within a tenant every document's
    first chunks before any document's later ones: a note written after a bulk write (of
    its own tenant or another's) waits one batch, not the whole backlog."""
    bulk, other = worker_db.make_tenant(), worker_db.make_tenant()
    worker_db.add_chunks(bulk, [f"bulk chunk {i} of a very long upload" for i in range(120)])
    worker_db.add_chunks(bulk, ["the deploy freeze starts on December 20"])
    worker_db.add_chunks(other, ["another tenant's note about the boiler"])
    rec = Recording(embedder)
    worker = QueueWorker(worker_engine, rec, _settings(worker_batch_rows=16),
                         tenants=[bulk, other])
    first = worker.process_batch(EMBEDDABLE[0])
    assert "another tenant's note about the boiler" in rec.texts
    assert "the deploy freeze starts on December 20" in rec.texts
    assert first.claimed == 16, ("the share the other tenant could not fill goes to the bulk "
                                 "one, and the shares rounded up never pass the batch size")
    assert sum("bulk chunk" in t for t in rec.texts) == first.claimed - 2
    worker.drain()
    assert {s[1] for s in worker_db.states(bulk) + worker_db.states(other)} == {"ready"}
    assert sorted(rec.texts) == sorted(set(rec.texts)), "no row embedded twice"


def test_a_batch_never_passes_its_size_when_the_shares_round_up(
        worker_db: WorkerDatabase, worker_engine: Engine, embedder: Embedder) -> None:
    """Three tenants with a backlog each and 16 rows a batch: shares of ceil(16 / 3) = 6 claim
    18 rows; the batch keeps 16, a row per tenant in turn (6, 5, 5), and the two left out
    are embedded by a later batch."""
    tenants = [worker_db.make_tenant() for _ in range(3)]
    for n, t in enumerate(tenants):
        worker_db.add_chunks(t, [f"tenant {n} backlog chunk {i}" for i in range(10)])
    rec = Recording(embedder)
    worker = QueueWorker(worker_engine, rec, _settings(worker_batch_rows=16), tenants=tenants)
    first = worker.process_batch(EMBEDDABLE[0])
    assert first.claimed == 16 and len(rec.texts) == 16
    per_tenant = sorted(sum(t.startswith(f"tenant {n} ") for t in rec.texts) for n in range(3))
    assert per_tenant == [5, 5, 6]
    worker.drain()
    assert {s[1] for t in tenants for s in worker_db.states(t)} == {"ready"}
    assert len(rec.texts) == 30 and len(set(rec.texts)) == 30


def test_backoff_defers_a_failed_row(worker_db: WorkerDatabase, worker_engine: Engine,
                                     embedder: Embedder) -> None:
    tenant = worker_db.make_tenant()
    worker_db.add_chunks(tenant, ["POISON pill", "fine text"])
    rec = Recording(embedder, poison="POISON")
    worker = QueueWorker(worker_engine, rec, _settings(worker_backoff_s=60), tenants=[tenant])
    report = worker.drain(wait_for_retries=False)
    assert report.rows == 1 and report.retried == 1
    with worker_db.admin.connect() as conn:
        wait = conn.execute(text(
            "select extract(epoch from retry_at - now()) from worker.embed_retries "
            "where tenant_id = :t"), {"t": tenant}).scalar_one()
    assert 50 < float(wait) <= 60
    calls = rec.calls
    assert worker.drain(wait_for_retries=False).rows == 0
    assert rec.calls == calls, "a row backing off is not claimed again before its time"


def test_worker_refuses_a_model_that_is_not_active(worker_db: WorkerDatabase,
                                                   worker_engine: Engine,
                                                   embedder: Embedder) -> None:
    wrong = Recording(embedder, model_name="intfloat/e5-small-v2")
    with pytest.raises(ModelMismatch, match="active embedding model is sentence-transformers"):
        QueueWorker(worker_engine, wrong, _settings()).check_model()


def test_notify_wakes_a_listening_worker(worker_db: WorkerDatabase, worker_engine: Engine,
                                         embedder: Embedder) -> None:
    tenant = worker_db.make_tenant()
    worker = QueueWorker(worker_engine, Recording(embedder), _settings(worker_poll_s=120),
                         tenants=[tenant])
    stop = threading.Event()
    thread = threading.Thread(target=worker.run_forever, args=(worker_db.listen_dsn, stop))
    thread.start()
    try:
        time.sleep(1.0)  # the worker has drained and sleeps on LISTEN for up to 120 s
        worker_db.add_chunks(tenant, ["arrives while the worker sleeps"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and worker_db.states(tenant)[0][1] != "ready":
            time.sleep(0.1)
        assert worker_db.states(tenant)[0][1] == "ready", "NOTIFY woke the worker before its poll"
    finally:
        stop.set()
        with worker_db.admin.begin() as conn:  # wake it so it sees the stop flag
            conn.execute(text("select pg_notify('engram_embed', 'stop')"))
        thread.join(timeout=30)


def test_a_listening_worker_hands_other_channels_their_payloads(
        worker_db: WorkerDatabase, worker_engine: Engine, embedder: Embedder) -> None:
    """``on_notify``: the queue's connection listens on more channels (``engram worker run``:
    the extraction wake) and calls each one's callback with the payload, between drains, and
    once with none on connecting (a wake sent while nothing listened is not lost)."""
    from orchestrator.derive.extract import EXTRACT_CHANNEL

    tenant = worker_db.make_tenant()
    worker = QueueWorker(worker_engine, Recording(embedder), _settings(worker_poll_s=120),
                         tenants=[tenant])
    heard: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=worker.run_forever, args=(worker_db.listen_dsn, stop),
                              kwargs={"on_notify": {EXTRACT_CHANNEL: heard.append}})
    thread.start()
    try:
        time.sleep(1.0)  # drained; asleep on LISTEN for up to 120 s
        with worker_db.admin.begin() as conn:
            conn.execute(text("select pg_notify(:c, 'wake')"), {"c": EXTRACT_CHANNEL})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(heard) < 2:
            time.sleep(0.05)
        assert heard == ["", "wake"]  # once on connecting (what no one heard), then the NOTIFY
    finally:
        stop.set()
        with worker_db.admin.begin() as conn:
            conn.execute(text("select pg_notify('engram_embed', 'stop')"))
        thread.join(timeout=30)


def _cli_env(test_db: TestDatabase, worker_db: WorkerDatabase) -> dict[str, str]:
    from sqlalchemy.engine import make_url

    url = make_url(worker_db.admin_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update({"ENGRAM_HOME": str(test_db.settings.home), "ENGRAM_DB_NAME": str(url.database),
                "ENGRAM_DB_PORT": str(url.port), "ENGRAM_WORKER_BATCH_ROWS": "40"})
    return env


def test_sigkill_mid_batch_loses_nothing_and_duplicates_nothing(
        test_db: TestDatabase, worker_db: WorkerDatabase) -> None:
    if test_db.kind != "embedded":
        pytest.skip("the CLI subprocess finds the embedded server through ENGRAM_HOME")
    tenant = worker_db.make_tenant()
    texts = [f"paragraph {i} about the history of the lighthouse keeper's log" * 3
             for i in range(300)]
    worker_db.add_chunks(tenant, texts)
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "worker", "run", "--once",
           "--tenant", str(tenant)]
    env = _cli_env(test_db, worker_db)
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed_in_batch = False
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and first.poll() is None:
            with worker_db.admin.connect() as conn:
                # A worker transaction that holds row locks (it has an xid) and waits on
                # Python, i.e. the model: the middle of a batch.
                busy = conn.execute(text(
                    "select count(*) from pg_stat_activity where usename = 'engram_worker' "
                    "and datname = current_database() and backend_xid is not null "
                    "and state = 'idle in transaction'")).scalar_one()
                ready = conn.execute(text(
                    "select count(*) from sources.chunks where tenant_id = :t "
                    "and embed_state = 'ready'"), {"t": tenant}).scalar_one()
            if busy and ready >= 40:
                first.send_signal(signal.SIGKILL)
                killed_in_batch = True
                break
            time.sleep(0.02)
    finally:
        if first.poll() is None and not killed_in_batch:
            first.kill()
        first.wait(timeout=60)
    assert killed_in_batch, "the worker was killed while it held a claimed batch"
    assert first.returncode == -signal.SIGKILL

    with worker_db.admin.connect() as conn:
        before = conn.execute(text(
            "select count(*) filter (where embed_state = 'ready'), "
            "count(*) filter (where embed_state = 'pending') from sources.chunks "
            "where tenant_id = :t"), {"t": tenant}).one()
    assert before[0] + before[1] == 300 and before[1] > 0

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"embedded {before[1]} rows" in second.stdout, second.stdout
    assert f"model texts {before[1]}," in second.stdout, "the restart embedded only what was left"
    states = worker_db.states(tenant)
    assert [s[1] for s in states] == ["ready"] * 300
    assert {s[2] for s in states} == {1}, "no row was written twice (one attempt each)"
    with worker_db.admin.connect() as conn:
        cached = conn.execute(text(
            "select count(*) from worker.embedding_cache where tenant_id = :t"),
            {"t": tenant}).scalar_one()
    assert cached == 300


def test_worker_write_back_at_head(test_db: TestDatabase, admin_engine: Engine) -> None:
    """At head, engram_worker can write an embedding to a chunk of the session database."""
    org = f"wk-head-{uuid.uuid4().hex[:8]}"
    with admin_engine.begin() as conn:
        tid = conn.execute(text("select auth.create_tenant(:o, :o)"), {"o": org}).scalar_one()
        sid = conn.execute(text("select auth.create_scope(:t, 'team', '')"), {"t": tid}).scalar_one()
        doc = conn.execute(text(
            "insert into sources.documents (tenant_id, collection, path, title, body, scopes) "
            "values (:t, 'n', 'p', 'p', 'b', array[cast(:s as uuid)]) returning id"),
            {"t": tid, "s": sid}).scalar_one()
        conn.execute(text("insert into sources.chunks (tenant_id, document_id, ordinal, text, "
                          "char_start, char_end) values (:t, :d, 0, 'head text', 0, 9)"),
                     {"t": tid, "d": doc})
    engine = make_app_engine(test_db.database.role_url("engram_worker"), pool_size=1)
    try:
        report = QueueWorker(engine, Embedder.from_settings(Settings()), _settings(),
                             tenants=[tid]).drain()
    finally:
        engine.dispose()
    assert report.rows == 1


def test_facts_and_memories_are_embedded_too(worker_db: WorkerDatabase, worker_engine: Engine,
                                             embedder: Embedder) -> None:
    tenant = worker_db.make_tenant()
    with worker_db.admin.begin() as conn:
        scope = conn.execute(text("select id from auth.scopes where tenant_id = :t"),
                             {"t": tenant}).scalar_one()
        conn.execute(text(
            "insert into knowledge.fact_content (tenant_id, text, content_hash) "
            "values (:t, 'Ada leads the platform team', sha256(convert_to("
            "'Ada leads the platform team', 'UTF8')))"), {"t": tenant})
        conn.execute(text(
            "insert into memory.working_memory (tenant_id, session_id, user_id, text, scopes) "
            "values (:t, 's1', 'alice', 'alice asked about the budget', array[cast(:s as uuid)])"),
            {"t": tenant, "s": scope})
    rec = Recording(embedder)
    worker = QueueWorker(worker_engine, rec, _settings(), tenants=[tenant])
    report = worker.drain()
    assert worker.table_errors == {}
    assert report.per_table.get("knowledge.fact_content") == 1
    assert report.per_table.get("memory.working_memory") == 1
    assert sorted(rec.texts) == ["Ada leads the platform team", "alice asked about the budget"]
    with worker_db.admin.connect() as conn:
        states = conn.execute(text(
            "select (select embed_state::text from knowledge.fact_content where tenant_id = :t), "
            "(select embed_state::text from memory.working_memory where tenant_id = :t)"),
            {"t": tenant}).one()
    assert tuple(states) == ("ready", "ready")


def test_a_long_drain_says_how_far_it_is_and_a_short_one_says_nothing(
        worker_db: WorkerDatabase, worker_engine: Engine, embedder: Embedder,
        caplog: pytest.LogCaptureFixture) -> None:
    """Thousands of chunks keep the worker embedding for minutes: the log says how many rows
    are done, how many still wait and about how long they take (``DrainProgress``)."""
    import logging

    from orchestrator.health import Component
    from orchestrator.worker.queue import DrainProgress

    tenant = worker_db.make_tenant()
    worker_db.add_chunks(tenant, [f"progress note {i} about shelf {i % 9}" for i in range(120)])
    worker = QueueWorker(worker_engine, Recording(embedder), _settings(worker_batch_rows=40),
                         tenants=[tenant])
    ticks = iter(range(0, 10_000, 10))  # each look at the clock: 10 s later
    waiting: list[int] = []

    def pending() -> int:
        waiting.append(worker.pending())
        return waiting[-1]

    component = Component("embedding worker")
    progress = DrainProgress(pending, component, every_s=15.0, clock=lambda: float(next(ticks)))
    with caplog.at_level(logging.INFO):
        report = worker.drain(on_batch=progress.batch)
        progress.done()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("embedding:")]
    assert report.rows == 120
    # Batches of 40 at clock 10, 20 and 30, done at 40: progress once 15 s have passed since
    # the start (at 20 s: 80 rows, 40 waiting), not again 10 s later; then done.
    assert lines == ["embedding: 80 rows in 20 s (4.0 rows/s); 40 still waiting, about 10 s "
                     "left at this rate", "embedding: done, 120 rows in 40 s (3.0 rows/s)"], lines
    assert waiting == [40]
    # The component is ok and holds the line for the log; it writes no second line of its own,
    # and what /readyz shows (anyone may ask it) holds no counts: they span tenants.
    assert component.state == "ok" and component.detail == lines[0]
    assert component.to_json()["detail"] == "" and "waiting" not in str(component.to_json())
    assert not [r for r in caplog.records if r.name == "engram.health"], caplog.records

    # A drain shorter than the interval logs nothing.
    caplog.clear()
    worker_db.add_chunks(tenant, ["one more progress note"])
    quiet = DrainProgress(worker.pending, every_s=15.0)
    with caplog.at_level(logging.INFO, logger="engram.worker.queue"):
        worker.drain(on_batch=quiet.batch)
        quiet.done()
    assert not [r for r in caplog.records if r.getMessage().startswith("embedding:")]
