"""Fixtures for the worker tests: a tiny cross-encoder, a database for the queue.

No cross-encoder ships in any package, so the reranker's mechanics are tested
with a randomly initialised BERT sequence classifier (two layers, 32 wide) that
reuses the packaged MiniLM's vocabulary. Its scores mean nothing; loading,
batching, windowing and ordering are what the tests check.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url


def build_tiny_cross_encoder(target: Path, *, max_positions: int = 128, seed: int = 7) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from orchestrator.worker.models import packaged_embedding_path

    vocab_from = packaged_embedding_path()
    assert vocab_from is not None, "the packaged MiniLM provides the tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(str(vocab_from), local_files_only=True)
    tokenizer.model_max_length = max_positions
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=max_positions, num_labels=1)
    model = BertForSequenceClassification(config)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return target


# -- a database for the queue tests -------------------------------------------------



@dataclass
class WorkerDatabase:
    admin_url: str
    worker_url: str
    listen_dsn: str
    revision: str
    admin: Engine

    def make_tenant(self, org_prefix: str = "wk") -> uuid.UUID:
        org = f"{org_prefix}-{uuid.uuid4().hex[:10]}"
        with self.admin.begin() as conn:
            tid = conn.execute(text("select auth.create_tenant(:o, :o)"), {"o": org}).scalar_one()
            conn.execute(text("select auth.create_scope(:t, 'team', 'The team scope')"),
                         {"t": tid})
        return uuid.UUID(str(tid))

    def add_chunks(self, tenant: uuid.UUID, texts: list[str], path: str | None = None) -> uuid.UUID:
        with self.admin.begin() as conn:
            scope = conn.execute(text("select id from auth.scopes where tenant_id = :t"),
                                 {"t": tenant}).scalar_one()
            doc = conn.execute(text(
                "insert into sources.documents (tenant_id, collection, path, title, body, scopes) "
                "values (:t, 'notes', :p, :p, :b, array[cast(:s as uuid)]) returning id"),
                {"t": tenant, "p": path or uuid.uuid4().hex, "b": " ".join(texts)[:100000],
                 "s": scope}).scalar_one()
            conn.execute(text(
                "insert into sources.chunks (tenant_id, document_id, ordinal, text, char_start, "
                "char_end) select :t, :d, o - 1, x, 0, length(x) "
                "from unnest(cast(:xs as text[])) with ordinality as u(x, o)"),
                {"t": tenant, "d": doc, "xs": texts})
        return uuid.UUID(str(doc))

    def states(self, tenant: uuid.UUID) -> list[tuple[str, str, int, str | None, str | None]]:
        with self.admin.connect() as conn:
            rows = conn.execute(text(
                "select text, embed_state::text, embed_attempts, embed_model, embed_error "
                "from sources.chunks where tenant_id = :t order by ordinal"), {"t": tenant}).all()
        return [tuple(r) for r in rows]  # type: ignore[misc]


@pytest.fixture(scope="session")
def worker_db(test_db) -> Iterator[WorkerDatabase]:  # type: ignore[no-untyped-def]
    """A database of its own, migrated to head (the queue tests change installation state)."""
    with worker_database(test_db) as db:
        yield db


@pytest.fixture
def fresh_worker_db(test_db) -> Iterator[WorkerDatabase]:  # type: ignore[no-untyped-def]
    """Like ``worker_db``, for a test that changes installation-wide state (the model)."""
    with worker_database(test_db) as db:
        yield db


@contextmanager
def worker_database(test_db) -> Iterator[WorkerDatabase]:  # type: ignore[no-untyped-def]
    from orchestrator.db import migrate

    revision = "head"
    name = f"engram_wk_{uuid.uuid4().hex[:8]}"
    root = create_engine(test_db.admin_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    with root.connect() as conn:
        conn.exec_driver_sql(f'create database "{name}"')
    admin_url = make_url(test_db.admin_url).set(database=name).render_as_string(
        hide_password=False)
    migrate.upgrade(admin_url, revision)
    worker_url = make_url(test_db.database.role_url("engram_worker")).set(
        database=name).render_as_string(hide_password=False)
    listen_dsn = make_url(worker_url).set(drivername="postgresql").render_as_string(
        hide_password=False)
    admin = create_engine(admin_url)
    try:
        yield WorkerDatabase(admin_url, worker_url, listen_dsn, revision, admin)
    finally:
        admin.dispose()
        with root.connect() as conn:
            conn.exec_driver_sql(f'drop database "{name}" with (force)')
        root.dispose()
