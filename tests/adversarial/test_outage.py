"""A database restart under a running ``engram up`` and a separate ``engram worker run``.

Before: after ``engram db stop`` + ``engram db start`` the separate worker exited with
"server closed the connection unexpectedly", the worker thread of ``engram up`` died
silently while the API kept serving (so new writes were never embedded and nothing said
so), and the API answered the outage with 403 FORBIDDEN carrying the driver's text with
the server's host and port. Now: both workers reconnect with back-off and drain the
queue, ``/readyz`` shows the outage per part, and the API answers UNAVAILABLE (503)
during it and normally after.
"""

from __future__ import annotations

import time

import pytest

from orchestrator.errors import Unavailable
from tests.support.stack import RECALL, UPSERT, Stack, wait_for


@pytest.mark.slow
def test_a_database_restart_under_engram_up_and_a_separate_worker(stack: Stack) -> None:
    s = stack
    r = s.post(UPSERT, {"p": "outage/before.md", "b": "The lighthouse keeper logged a storm. " * 5})
    assert r.status_code == 200 and "errors" not in r.json(), r.text
    wait_for("the chunk written before the outage to be embedded", lambda: s.chunks()[1] == 0)

    started = time.monotonic()
    s.database.server.stop()
    port = str(s.settings.db_port)
    for query, variables in ((RECALL, {"q": "What did the keeper log?"}),
                             (UPSERT, {"p": "outage/during.md", "b": "Written while the database is down."})):
        answer = s.post(query, variables)
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"]
        (error,) = answer.json()["errors"]
        assert error["extensions"]["code"] == "UNAVAILABLE" and error["message"] == Unavailable.MESSAGE
        assert "127.0.0.1" not in answer.text and port not in answer.text

    def shows_the_outage() -> bool:
        status, body = s.ready()
        parts = body.get("components", {})
        return (status == 503 and body["database"]["ok"] is False
                and parts.get("embedding worker", {}).get("state") == "reconnecting"
                and parts.get("derive schedule", {}).get("state") == "reconnecting")

    wait_for("/readyz to show the database and both loops of engram up reconnecting", shows_the_outage,
             timeout=60)
    down = s.ready()[1]
    assert "127.0.0.1" not in str(down) and port not in str(down)

    s.restart_database()
    outage_s = time.monotonic() - started
    assert s.procs["worker"].poll() is None, "the separate worker is still running:\n" + s.log("worker")
    assert s.procs["up"].poll() is None, s.log("up")
    wait_for("engram up to be ready again", lambda: s.ready()[0] == 200, timeout=120)
    parts = s.ready()[1]["components"]
    assert parts["embedding worker"]["state"] == "ok" and parts["derive schedule"]["state"] == "ok"

    # Written after the restart: both workers are back and drain the queue, each chunk once.
    for i in range(5):
        r = s.post(UPSERT, {"p": f"outage/after-{i}.md", "b": f"After the outage, note {i} on tides. " * 5})
        assert r.status_code == 200 and "errors" not in r.json(), r.text
    wait_for("the queue to drain after the restart", lambda: s.chunks()[1] == 0, timeout=120)
    total, pending, twice = s.chunks()
    assert pending == 0 and twice == 0 and total >= 6
    assert s.scalar("select count(*) from sources.documents where tenant_id = :t "
                    "and path = 'outage/during.md'") == 0, "the write answered UNAVAILABLE left nothing"
    found = wait_for("a recall to answer", lambda: _recall(s), timeout=60)
    assert "storm" in found

    wait_for("the separate worker to log its reconnect",
             lambda: "embedding worker: working again after" in s.log("worker"), timeout=60)
    worker_log = s.log("worker")
    assert "reconnecting with back-off" in worker_log
    assert "server closed the connection unexpectedly" not in worker_log.split("reconnecting")[-1]
    up_log = s.log("up")
    assert "embedding worker: working again after" in up_log
    assert "derive schedule: working again after" in up_log
    print(f"\noutage: database down and up again in {outage_s:.1f} s; API answered UNAVAILABLE "
          f"(503) meanwhile; {total} chunks embedded once each after the restart")


def _recall(s: Stack) -> str | None:
    """A recall's answer; None (try again) only for the known race with a concurrent derive
    write: the recall's receipt re-reads each served row's version in its seal trigger, and a
    RAPTOR node the schedule updated in between fails it with 'was served at version ... but
    is now at version ...' (BAD_USER_INPUT): a bug of the receipt path this test found, left to
    the receipt work of issue 17."""
    r = s.post(RECALL, {"q": "What did the keeper log?"})
    assert r.status_code == 200, r.text
    body = r.json()
    if body.get("errors"):
        assert "was served at version" in body["errors"][0]["message"], body
        return None
    return r.text
