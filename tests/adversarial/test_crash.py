"""Crash tests: SIGKILL of the API and of the postmaster in the middle of a stream of writes.

Nothing acknowledged is lost: every write the API answered 200 for is there afterwards,
whole (its chunks with it), once; a write in flight when the process died is either all
there or not at all; the tenant's provenance chain verifies; and the queue drains with
every chunk embedded exactly once. The worker's own SIGKILL mid-batch is
``tests/test_worker_queue.py::test_sigkill_mid_batch_loses_nothing_and_duplicates_nothing``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest
from sqlalchemy import create_engine, pool, text

from orchestrator.audit.chain import verify
from orchestrator.db.server import free_port
from tests.support.stack import UPSERT, Stack, wait_for


@dataclass
class Writes:
    """Concurrent writers and what each request was answered."""

    prefix: str
    acknowledged: set[str] = field(default_factory=set)
    attempted: set[str] = field(default_factory=set)
    answers: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, s: Stack, url: str, writers: int = 4) -> list[threading.Thread]:
        def one(k: int) -> None:
            i = 0
            while not self.stop.is_set():
                path = f"{self.prefix}/{k}-{i}.md"
                i += 1
                with self.lock:
                    self.attempted.add(path)
                try:
                    r = s.post(UPSERT, {"p": path, "b": f"Write {path}: the ferry left at dawn. " * 8},
                               url=url, timeout=30)
                    answer = str(r.status_code)
                    if r.status_code == 200:
                        body = r.json()
                        ok = "errors" not in body and body["data"]["upsertDocument"]["created"] is True
                        answer = "200" if ok else f"200 with errors: {body}"
                        if ok:
                            with self.lock:
                                self.acknowledged.add(path)
                    elif r.status_code == 503:
                        answer = f"503 {r.json()['errors'][0]['extensions']['code']}"
                except httpx.TransportError as exc:
                    answer = f"no answer ({type(exc).__name__})"
                    time.sleep(0.05)
                with self.lock:
                    self.answers[answer] += 1

        threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(writers)]
        for t in threads:
            t.start()
        return threads

    def finish(self, threads: list[threading.Thread]) -> None:
        self.stop.set()
        for t in threads:
            t.join(timeout=60)


def stored(s: Stack, prefix: str) -> dict[str, int]:
    """Path -> chunk count of the tenant's documents under ``prefix``."""
    with s.admin.connect() as conn:
        rows = conn.execute(text(
            "select d.path, count(c.id) from sources.documents d left join sources.chunks c "
            "on c.tenant_id = d.tenant_id and c.document_id = d.id "
            "where d.tenant_id = :t and d.path like :p group by d.path"), {"t": s.tenant, "p": f"{prefix}/%"})
        return {r[0]: int(r[1]) for r in rows}


def nothing_lost(s: Stack, w: Writes) -> dict[str, int]:
    found = stored(s, w.prefix)
    assert w.acknowledged <= set(found), f"acknowledged but lost: {sorted(w.acknowledged - set(found))}"
    assert set(found) <= w.attempted
    assert all(n > 0 for n in found.values()), "a document without its chunks: a half-written write"
    in_flight = set(found) - w.acknowledged
    assert len(in_flight) <= 4, "at most one write in flight per writer"
    auditor = create_engine(s.database.role_url("engram_auditor"), poolclass=pool.NullPool)
    try:
        with auditor.connect() as conn:
            (rep,) = verify(conn, s.tenant)
    finally:
        auditor.dispose()
    assert rep.ok and rep.warnings == [], (rep.chain_break, rep.row_problems, rep.warnings)
    wait_for("the queue to drain", lambda: s.chunks()[1] == 0, timeout=180)
    assert s.chunks()[2] == 0, "no chunk was embedded twice"
    return found


@pytest.mark.slow
def test_sigkill_of_the_api_mid_write(stack: Stack) -> None:
    s = stack
    port = free_port()
    api = s.start("serve", "serve", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_for("engram serve to listen", lambda: (api.poll() is None or pytest.fail(s.log("serve")))
             and s.ready(url)[0] in (200, 503))
    w = Writes("crash-api")
    threads = w.run(s, url)
    wait_for("20 acknowledged writes", lambda: len(w.acknowledged) >= 20, timeout=120, every=0.05)
    api.send_signal(signal.SIGKILL)
    api.wait(timeout=30)
    s.procs.pop("serve", None)
    w.finish(threads)
    assert api.returncode == -signal.SIGKILL
    found = nothing_lost(s, w)
    print(f"\nAPI SIGKILL: {len(w.acknowledged)} acknowledged writes, {len(found)} stored "
          f"({len(found) - len(w.acknowledged)} in flight and complete), 0 lost, 0 duplicated; "
          f"answers {dict(w.answers)}")


@pytest.mark.slow
def test_sigkill_of_the_postmaster_mid_write(stack: Stack) -> None:
    s = stack
    w = Writes("crash-postmaster")
    threads = w.run(s, s.url)
    wait_for("20 acknowledged writes", lambda: len(w.acknowledged) >= 20, timeout=120, every=0.05)
    pid = s.postmaster_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for("writes answered UNAVAILABLE", lambda: any(a.startswith("503") for a in w.answers), timeout=60)
    w.finish(threads)
    assert set(w.answers) <= {"200", "503 UNAVAILABLE"}, w.answers
    s.restart_database()
    wait_for("engram up to be ready again", lambda: s.ready()[0] == 200, timeout=120)
    found = nothing_lost(s, w)
    print(f"\npostmaster SIGKILL: {len(w.acknowledged)} acknowledged writes, {len(found)} stored after "
          f"crash recovery, 0 lost, 0 duplicated, every chunk embedded once; answers {dict(w.answers)}")
