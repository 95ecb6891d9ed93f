"""Several worker processes drain one queue with no duplicate work (docs/scale-out.md).

Three real ``engram worker run --once`` processes (each its own Python, its own model,
its own connections, as three containers or GPU hosts would be) are started against one
queue of chunks. So that they really overlap, the test holds the embedding-model registry
row FOR UPDATE until all three wait on it (every batch takes that row FOR SHARE first),
then lets them go at once. Checked: every chunk is embedded exactly once (one attempt,
one cached vector per text), the three reports add up to the queue, and each process did
part of the work.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from orchestrator.config import Settings
from tests.support.cli import ENGRAM, engram_env
from tests.support.worker import WorkerDatabase, worker_db

__all__ = ["worker_db"]

pytestmark = pytest.mark.slow

PROCESSES = 3
CHUNKS = 96


def test_three_workers_embed_every_chunk_exactly_once(settings: Settings,
                                                       worker_db: WorkerDatabase) -> None:
    tenant = worker_db.make_tenant("scale")
    texts = [f"entry {i}: the ferry timetable for pier {i % 17} changes in week {i}" for i in range(CHUNKS)]
    worker_db.add_chunks(tenant, texts)
    url = make_url(worker_db.admin_url)
    env = engram_env(settings, ENGRAM_DB_NAME=str(url.database), ENGRAM_WORKER_BATCH_ROWS="8",
                     ENGRAM_DERIVE_INTERVAL_S="0")
    if settings.database_url:
        env["ENGRAM_DATABASE_URL"] = worker_db.admin_url
    cmd = [ENGRAM, "worker", "run", "--once", "--no-derive", "--tenant", str(tenant)]

    gate = worker_db.admin.connect()
    gate.begin()
    gate.execute(text("select 1 from worker.embedding_models where active for update"))
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(PROCESSES)]
    try:
        deadline = time.monotonic() + 240
        while True:
            with worker_db.admin.connect() as conn:
                waiting = conn.execute(text(
                    "select count(*) from pg_stat_activity where usename = 'engram_worker' "
                    "and datname = current_database() and wait_event_type = 'Lock'")).scalar_one()
            if waiting >= PROCESSES:
                break
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "the workers never reached the queue"
            time.sleep(0.1)
    finally:
        gate.rollback()  # all three go at once
        gate.close()
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        outputs.append(out)

    rows = [int(re.search(r"embedded (\d+) rows", o).group(1)) for o in outputs]  # type: ignore[union-attr]
    model_texts = [int(re.search(r"model texts (\d+),", o).group(1)) for o in outputs]  # type: ignore[union-attr]
    assert sum(rows) == CHUNKS, outputs
    assert sum(model_texts) == CHUNKS, "no text went to the model twice"
    assert all(n > 0 for n in rows), f"each process took part: {rows}"
    states = worker_db.states(tenant)
    assert [s[1] for s in states] == ["ready"] * CHUNKS
    assert {s[2] for s in states} == {1}, "every chunk was written once (one attempt each)"
    with worker_db.admin.connect() as conn:
        cached = conn.execute(text(
            "select count(*) from worker.embedding_cache where tenant_id = :t"), {"t": tenant}).scalar_one()
    assert cached == CHUNKS
    print(f"rows per process: {rows}")  # the split, for the log
