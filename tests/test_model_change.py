"""Changing the embedding model while recall runs: backfill, activate, follow; never mixed.

Each test has a database of its own (the active model is installation-wide). The
candidates are real models derived from the packaged MiniLM (``tests/support/models.py``):
a rotation (same dimension, same neighbourhoods, incompatible vectors) and a projection
to another dimension.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from orchestrator.auth import Identity
from orchestrator.auth.devkey import create_dev_key, mint_token
from orchestrator.cli.main import app
from orchestrator.config import Settings
from orchestrator.db import indexes
from orchestrator.db.engine import make_app_engine
from orchestrator.db.server import free_port
from orchestrator.recall import Recaller
from orchestrator.worker.embedder import Embedder
from orchestrator.worker.model_change import ModelChange, shadow_index_name
from orchestrator.worker.queue import QueueWorker
from orchestrator.worker.registry import ModelMismatch, read_active
from tests.conftest import TestDatabase
from tests.support.models import ROTATED, build_model
from tests.support.worker import WorkerDatabase, fresh_worker_db

__all__ = ["fresh_worker_db"]

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
PROJECTED = "tests/minilm-96"
TEXTS = [
    "Maria Lopez booked the ryokan in Kyoto for the April offsite.",
    "The quarterly budget review moved to Thursday afternoon.",
    "Our build pipeline runs on spot instances to save money.",
    "Tom adopted a golden retriever puppy named Biscuit.",
    "The database migration froze writes for eleven minutes.",
    "Priya leads the search relevance team since March.",
    "The coffee machine on the third floor is broken again.",
    "We renewed the office lease for another five years.",
    "The mobile app crashes when the camera permission is denied.",
    "Customer churn fell after the onboarding emails were rewritten.",
    "The data center in Frankfurt switched to renewable power.",
    "Ana presented the hiring plan to the board in May.",
]
QUESTION = "Which lodging did someone reserve in Japan?"


class Recording:
    """A real embedder whose every embedded text is recorded."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_name = inner.model_name
        self.dimension = inner.dimension
        self.texts: list[str] = []

    def embed_passages(self, texts: Sequence[str]) -> Any:
        self.texts.extend(texts)
        return self.inner.embed_passages(texts)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedding-models")


@pytest.fixture(scope="module")
def settings_md(models_dir: Path) -> Settings:
    """Settings that find the test models by registered name."""
    return Settings(embedding_models_dir=models_dir, worker_batch_rows=64, worker_poll_s=0.5)


@dataclass
class Installation:
    db: WorkerDatabase
    app: Engine
    worker: Engine
    org: str
    tenant: uuid.UUID

    def identity(self) -> Identity:
        return Identity.of(self.org, "alice", read=("team",), write=("team",))

    def scalar(self, sql: str, **params: Any) -> Any:
        with self.db.admin.connect() as conn:
            return conn.execute(text(sql), params).scalar()


@pytest.fixture
def installation(fresh_worker_db: WorkerDatabase, test_db: TestDatabase,
                 settings_md: Settings) -> Iterator[Installation]:
    db = fresh_worker_db
    name = make_url(db.admin_url).database
    app = make_app_engine(make_url(test_db.database.app_url()).set(database=name)
                          .render_as_string(hide_password=False), pool_size=2)
    worker = make_app_engine(db.worker_url, pool_size=2)
    org = f"mc-{uuid.uuid4().hex[:10]}"
    with db.admin.begin() as conn:
        tenant = conn.execute(text("select auth.create_tenant(:o, :o)"), {"o": org}).scalar_one()
        scope = conn.execute(text("select auth.create_scope(:t, 'team', 'The team')"),
                             {"t": tenant}).scalar_one()
        conn.execute(text(
            "insert into memory.working_memory (tenant_id, session_id, user_id, text, scopes) "
            "values (:t, 's1', 'alice', 'alice prefers window seats on trains', "
            "array[cast(:s as uuid)])"), {"t": tenant, "s": scope})
    tenant = uuid.UUID(str(tenant))
    for i, one in enumerate(TEXTS):
        db.add_chunks(tenant, [one], path=f"note-{i}.md")
    inst = Installation(db, app, worker, org, tenant)
    try:
        yield inst
    finally:
        app.dispose()
        worker.dispose()


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    return Embedder.from_settings(Settings())


def _drain(inst: Installation, embedder: Any, settings: Settings, **kw: Any) -> int:
    return QueueWorker(inst.worker, embedder, settings, tenants=[inst.tenant], **kw).drain().rows


def _evidence(recaller: Recaller, inst: Installation) -> tuple[list[str], str]:
    result, trace = recaller.trace(inst.identity(), QUESTION, budget_tokens=2000)
    return [e.text for e in result.evidence], trace.embedding_model


def test_same_dimension_backfill_resumes_activation_refuses_then_flips(
        installation: Installation, minilm: Embedder, models_dir: Path,
        settings_md: Settings) -> None:
    inst = installation
    assert _drain(inst, minilm, settings_md) == len(TEXTS) + 1
    recaller = Recaller(inst.app, settings_md)
    before, model_before = _evidence(recaller, inst)
    assert before[0] == TEXTS[0] and model_before == f"{MINILM}@1"

    change = ModelChange(inst.worker, inst.db.admin)
    with pytest.raises(ModelMismatch, match="not registered"):
        change.activate(ROTATED)
    rotated = Recording(Embedder.from_path(build_model(models_dir, ROTATED), settings=settings_md,
                                           model_name=ROTATED))
    change.register(ROTATED, 384)
    with pytest.raises(ModelMismatch) as refused:
        change.activate(ROTATED)
    assert (f"the backfill of {ROTATED} is incomplete ({len(TEXTS) + 1} ready rows lack its "
            f"vector; sources.chunks: {len(TEXTS)} rows; memory.working_memory: 1 rows)"
            in refused.value.message)

    class Interrupted(Exception):
        pass

    def stop_after_first_batch(done: int, total: int, label: str | None = None) -> None:
        assert total == len(TEXTS) + 1
        raise Interrupted

    with pytest.raises(Interrupted):
        change.backfill(rotated, batch=5, on_progress=stop_after_first_batch)
    assert [(c.table, c.covered) for c in change.coverage(ROTATED) if c.ready] == [
        ("sources.chunks", 5), ("memory.working_memory", 0)]
    report = change.backfill(rotated, batch=5)
    assert (report.rows, report.failed) == (len(TEXTS) + 1 - 5, [])
    assert len(rotated.texts) == len(TEXTS) + 1, "the second run embedded only what was missing"
    assert _evidence(recaller, inst)[1] == f"{MINILM}@1", "recall stays on the active model"

    done = change.activate(ROTATED)
    assert (done.model.name, done.model.generation, done.previous.generation) == (ROTATED, 2, 1)
    assert done.switched["sources.chunks"] == len(TEXTS)

    # The recaller built under MiniLM sees generation 2 in its statement, switches, and
    # serves what MiniLM served: the rotation keeps every similarity inside the model.
    after, model_after = _evidence(recaller, inst)
    assert model_after == f"{ROTATED}@2" and recaller.active_model.key == f"{ROTATED}@2"
    assert after == before
    # ... which proves nothing was mixed only because a mixed ranking would differ.
    q = minilm.embed_query(QUESTION)
    mixed = np.argsort(-(rotated.inner.embed_passages(TEXTS) @ q))
    honest = np.argsort(-(minilm.embed_passages(TEXTS) @ q))
    assert list(mixed) != list(honest)
    with pytest.raises(ModelMismatch, match=f"the active embedding model is {ROTATED}"):
        Recaller(inst.app, settings_md, embedder=minilm).recall(inst.identity(), QUESTION)

    # Workers: one without a loader stops; one with a loader carries on with the new model.
    inst.db.add_chunks(inst.tenant, ["Written after the flip: the ryokan confirmed by email."])
    with pytest.raises(ModelMismatch, match=f"active embedding model is {ROTATED}"):
        _drain(inst, minilm, settings_md)
    assert _drain(inst, minilm, settings_md,
                  loader=lambda m: Embedder.for_model(settings_md, m)) == 1
    assert inst.scalar("select embed_model from sources.chunks where tenant_id = :t and "
                       "text like 'Written after%'", t=inst.tenant) == ROTATED


def test_another_dimension_is_a_generated_column_swap(
        installation: Installation, test_db: TestDatabase, minilm: Embedder, models_dir: Path,
        settings_md: Settings, tmp_path: Path) -> None:
    inst = installation
    _drain(inst, minilm, settings_md)
    recaller = Recaller(inst.app, settings_md)
    # Enough recalls on one pooled connection that the driver prepares the statement on
    # the server: the flip must not leave a prepared plan whose result type changed.
    for _ in range(6):
        assert _evidence(recaller, inst)[0][0] == TEXTS[0]
    app_update = inst.scalar("select has_column_privilege('engram_app', 'sources.chunks', "
                             "'embedding', 'UPDATE')")
    change = ModelChange(inst.worker, inst.db.admin)
    projected = Embedder.from_path(build_model(models_dir, PROJECTED, 96), settings=settings_md,
                                   model_name=PROJECTED)
    change.register(PROJECTED, 96)
    # The way back from a dimension backfill: --discard drops what it added.
    env = _serve_env(test_db, inst, tmp_path, models_dir, free_port())
    change._add_shadow_columns(96)
    discarded = CliRunner().invoke(app, ["models", "backfill", PROJECTED, "--discard"], env=env)
    assert discarded.exit_code == 0 and "dropped the candidate columns of sources.chunks" \
        in discarded.output, discarded.output
    assert inst.scalar("select count(*) from pg_attribute where attname = 'embedding_next' "
                       "and not attisdropped") == 0
    # The tenant's own vector indexes (engram db tenant-index) are copied and swapped with the
    # shared ones; working_memory's copy is named past 63 bytes, which PostgreSQL cuts.
    org = inst.scalar("select org_id from auth.tenants where id = :t", t=inst.tenant)
    with inst.db.admin.connect() as conn:
        own_steps = indexes.tenant_index_steps(conn, org)
    indexes.run(inst.db.admin, own_steps)
    own = sorted(step.index for step in own_steps)
    report = change.backfill(projected, batch=8)
    assert shadow_index_name(indexes.tenant_index_name(inst.tenant, "working_memory")) in \
        {name.split(".")[1] for name in report.indexes_built}
    status = CliRunner().invoke(app, ["models", "status", PROJECTED], env=env)
    assert status.exit_code == 0 and f"candidate {PROJECTED} (96-d" in status.output
    assert report.rows == len(TEXTS) + 1
    assert "sources.ix_chunks_embedding_next_hnsw" in report.indexes_built
    assert inst.scalar("select format_type(atttypid, atttypmod) from pg_attribute where "
                       "attrelid = 'sources.chunks'::regclass and attname = 'embedding_next'"
                       ) == "vector(96)"
    assert _evidence(recaller, inst)[1] == f"{MINILM}@1"

    # A text edited after its backfill, embedded again by the active model: lacking again.
    with inst.db.admin.begin() as conn:
        conn.execute(text("update sources.chunks set text = 'Maria Lopez booked a ryokan in "
                          "Kyoto, and a hotel in Osaka.' where tenant_id = :t and text = :x"),
                     {"t": inst.tenant, "x": TEXTS[0]})
    assert _drain(inst, minilm, settings_md) == 1
    with pytest.raises(ModelMismatch, match=r"\(1 ready rows lack its vector; sources.chunks: 1 "):
        change.activate(PROJECTED)
    assert change.backfill(projected).rows == 1

    done = change.activate(PROJECTED)
    assert (done.model.name, done.model.dimension, done.model.generation) == (PROJECTED, 96, 2)
    columns = {r[0]: r[1] for r in inst.db.admin.connect().execute(text(
        "select attname, format_type(atttypid, atttypmod) from pg_attribute where "
        "attrelid = 'sources.chunks'::regclass and not attisdropped and attnum > 0"))}
    assert columns["embedding"] == "vector(96)"
    assert "embedding_next" not in columns and "embedded_next_at" not in columns
    assert inst.scalar("select i.indisvalid from pg_index i join pg_class c on c.oid = "
                       "i.indexrelid where c.relname = 'ix_chunks_embedding_hnsw'") is True
    assert inst.scalar("select convalidated from pg_constraint where conname = "
                       "'ck_chunks_embedding_matches_state'") is True
    with inst.db.admin.connect() as conn:
        mine = next(t for t in indexes.tenant_indexes(conn) if t.tenant_id == inst.tenant)
    assert sorted(mine.own) == own and all(x.valid for x in mine.own.values())
    assert inst.scalar("select format_type(atttypid, atttypmod) from pg_attribute where "
                       "attrelid = 'memory.raptor_nodes'::regclass and attname = 'centroid'"
                       ) == "vector(96)"
    # The column's privileges moved over, and no more.
    assert inst.scalar("select has_column_privilege('engram_worker', 'sources.chunks', "
                       "'embedding', 'UPDATE')") is True
    assert inst.scalar("select has_column_privilege('engram_worker', 'sources.chunks', "
                       "'embedding', 'SELECT')") is False
    assert inst.scalar("select has_column_privilege('engram_app', 'sources.chunks', "
                       "'embedding', 'UPDATE')") is app_update
    # The chain was re-baselined: every row still verifies.
    with inst.db.admin.connect() as conn:
        assert conn.execute(text("select * from provenance.verify_rows(:t)"),
                            {"t": inst.tenant}).all() == []

    # The recaller still holds a 384-d question embedding: the statement fails on the old
    # dimension, the recaller reads the registry, loads the 96-d model and answers.
    evidence, model = _evidence(recaller, inst)
    assert model == f"{PROJECTED}@2" and "ryokan" in evidence[0]
    inst.db.add_chunks(inst.tenant, ["Written after the flip to 96 dimensions."])
    assert _drain(inst, minilm, settings_md,
                  loader=lambda m: Embedder.for_model(settings_md, m)) == 1
    assert inst.scalar("select vector_dims(embedding) from sources.chunks where tenant_id = :t "
                       "and text like 'Written after%'", t=inst.tenant) == 96
    with inst.worker.connect() as conn:
        assert read_active(conn).key == f"{PROJECTED}@2"


ENGRAM = str(Path(sys.executable).with_name("engram"))


def _serve_env(test_db: TestDatabase, inst: Installation, home: Path, models_dir: Path,
               port: int) -> dict[str, str]:
    s = test_db.settings
    name = make_url(inst.db.admin_url).database
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(ENGRAM_HOME=str(s.home), ENGRAM_DB_PORT=str(s.db_port), ENGRAM_DB_NAME=str(name),
               ENGRAM_AUTH_DEV_KEY_PATH=str(home / "dev-key.pem"), ENGRAM_AUTH_TRUST_DEV_KEY="true",
               ENGRAM_API_PORT=str(port), ENGRAM_EMBEDDING_MODELS_DIR=str(models_dir))
    if s.database_url:
        env.update(ENGRAM_DATABASE_URL=inst.db.admin_url)
        for role in ("app", "worker", "auditor"):
            if getattr(s, f"{role}_password"):
                env[f"ENGRAM_{role.upper()}_PASSWORD"] = str(getattr(s, f"{role}_password"))
    return env


def test_a_running_api_follows_a_flip_and_never_mixes(
        installation: Installation, test_db: TestDatabase, minilm: Embedder, models_dir: Path,
        settings_md: Settings, tmp_path: Path) -> None:
    """`engram serve` in its own process; `engram models backfill/activate` as an operator
    runs them; recalls over HTTP before, during and after the flip."""
    inst = installation
    build_model(models_dir, ROTATED)
    _drain(inst, minilm, settings_md)
    port = free_port()
    env = _serve_env(test_db, inst, tmp_path, models_dir, port)
    create_dev_key(Settings(auth_dev_key_path=tmp_path / "dev-key.pem"))
    token = mint_token(Settings(auth_dev_key_path=tmp_path / "dev-key.pem"), tenant=inst.org,
                       user="alice", scopes=["read:team"])
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([ENGRAM, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def recall() -> tuple[str, list[str]]:
        body = httpx.post(f"{url}/graphql", headers={"authorization": f"Bearer {token}"},
                          timeout=180, json={"query": "query($q: String!) { recall(question: $q, "
                                             "budgetTokens: 2000) { embeddingModel evidence { text } } }",
                                             "variables": {"q": QUESTION}}).json()
        assert "errors" not in body, body
        return body["data"]["recall"]["embeddingModel"], [
            e["text"] for e in body["data"]["recall"]["evidence"]]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([ENGRAM, "models", *args], env=env, capture_output=True, text=True,
                              timeout=600, check=False)

    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "engram serve did not start"
            time.sleep(0.3)
        before = recall()
        assert before[0] == f"{MINILM}@1" and "ryokan" in before[1][0]

        ModelChange(inst.worker, inst.db.admin).register(ROTATED, 384)
        refused = cli("activate", ROTATED)
        assert refused.returncode == 1
        assert f"the backfill of {ROTATED} is incomplete ({len(TEXTS) + 1} ready rows lack" \
            in refused.stderr.replace("\n", " ")
        filled = cli("backfill", ROTATED)
        assert filled.returncode == 0, filled.stderr
        assert "complete: `engram models activate" in filled.stdout
        assert recall() == before, "the backfill changes nothing recall serves"

        seen: list[tuple[str, list[str]]] = []
        flipped = threading.Event()

        def hammer() -> None:
            while not flipped.is_set() or len(seen) < 3 or seen[-1][0] != f"{ROTATED}@2":
                seen.append(recall())
                if len(seen) > 200:
                    return

        thread = threading.Thread(target=hammer)
        thread.start()
        done = cli("activate", ROTATED)
        flipped.set()
        thread.join(timeout=300)
        assert done.returncode == 0, done.stderr
        assert f"active: {ROTATED} (384-d, generation 2)" in done.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    models = {m for m, _ in seen}
    # The activation command starts in seconds; recalls take a fraction of one.
    assert models == {f"{MINILM}@1", f"{ROTATED}@2"} and seen[-1][0] == f"{ROTATED}@2"
    # Every answer, whichever model asked, is the answer MiniLM gave: nothing was mixed (a
    # MiniLM question against rotated vectors ranks by noise; see the first test).
    assert all(evidence == before[1] for _, evidence in seen)
