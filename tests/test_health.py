"""Supervision of long-running loops (orchestrator/health.py) and key-set state, without a database."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest

from orchestrator.auth.jwks import KeySet
from orchestrator.errors import Unauthenticated, Unavailable
from orchestrator.health import Backoff, Component, supervise


def test_backoff_doubles_to_its_cap_with_jitter_and_resets() -> None:
    b = Backoff(0.5, 4.0)
    delays = [b.delay() for _ in range(6)]
    for got, base in zip(delays, [0.5, 1.0, 2.0, 4.0, 4.0, 4.0], strict=True):
        assert 0.8 * base <= got <= 1.2 * base
    b.reset()
    assert b.delay() <= 0.6


def test_supervise_reconnects_then_runs_and_logs_each_change_once(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    component = Component("test loop")
    calls: list[str] = []

    def body() -> None:
        calls.append("try")
        if len(calls) <= 3:  # the database is down for three tries
            raise psycopg.OperationalError("connection failed: Connection refused")
        component.ok("working")
        assert component.state == "ok"
        stop.set()

    with caplog.at_level(logging.INFO, logger="engram.health"):
        supervise(component, body, stop, backoff=Backoff(0.01, 0.02))
    assert len(calls) == 4 and component.state == "ok" and component.failures == 0
    said = [r.getMessage() for r in caplog.records]
    assert sum("reconnecting with back-off" in m for m in said) == 1, said
    assert any("working again after 3 failed tries" in m for m in said), said
    assert "127.0.0.1" not in " ".join(said)


def test_supervise_marks_other_failures_failing_and_a_permanent_one_dead() -> None:
    stop = threading.Event()
    component = Component("test loop")
    seen: list[str] = []

    def body() -> None:
        if not seen:
            seen.append(component.state)
            raise RuntimeError("a bug")
        seen.append(component.state)
        raise LookupError("the model is no longer the active one")

    with pytest.raises(LookupError):
        supervise(component, body, stop, backoff=Backoff(0.01, 0.01), permanent=(LookupError,))
    assert seen == ["starting", "failing"]
    assert component.state == "dead" and "no longer the active one" in component.detail
    assert not component.healthy
    off = Component("off loop")
    off.off("turned off")
    assert off.healthy


def test_a_component_says_why_it_reconnects_without_host_or_port() -> None:
    c = Component("embedding worker")
    c.retrying(Unavailable(detail='connection to server at "10.0.0.7", port 5432 failed: refused'), 1.5)
    shown: dict[str, Any] = c.to_json()
    assert shown["state"] == "reconnecting" and shown["failures"] == 1
    assert shown["detail"] == "the database is unavailable: the connection was refused; next try in 1.5 s"


def test_a_key_set_reports_ok_retrying_and_failing() -> None:
    now = [0.0]
    up = [True]

    def fetch() -> dict[str, Any]:
        if not up[0]:
            raise Unauthenticated("the issuer's key set could not be read")
        return {"keys": [{"kid": "k1", "kty": "oct"}]}

    keys = KeySet(fetch, ttl_s=10, min_refresh_s=1, grace_s=20, retry_max_s=4, clock=lambda: now[0])
    assert keys.status()["state"] == "ok" and keys.status()["keys"] == 0
    keys.prefetch()
    assert keys.status() == {"state": "ok", "keys": 1, "failures": 0, "next_try_in_s": None}
    up[0] = False
    now[0] = 11.0  # past the TTL: the next lookup refetches, fails, answers from the cache
    keys.jwk("k1")
    status = keys.status()
    assert status["state"] == "retrying" and status["failures"] == 1
    now[0] = 40.0  # past the grace period as well
    assert keys.status()["state"] == "failing"
    up[0] = True
    keys.jwk("k1")
    assert keys.status()["state"] == "ok"


def test_the_warm_up_waits_for_a_database_that_is_not_up_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.api import health as api_health

    monkeypatch.setattr(api_health.time, "sleep", lambda _s: None)
    states: list[str] = []

    class Recaller:
        warmed = False

        def warm_up(self) -> dict[str, float]:
            states.append(warmup.state)
            if len(states) < 3:
                raise Unavailable(detail="connection refused")
            return {"models": 1.0}

    warmup = api_health.Warmup()
    warmup.run(Recaller())  # type: ignore[arg-type]
    assert states == ["loading", "waiting for the database", "waiting for the database"]
    assert warmup.state == "loaded" and "models 1 ms" in warmup.detail
