"""``/healthz`` and ``/readyz`` of the API server.

``/healthz`` is liveness: the process answers (200 always), so a supervisor restarts it
only when it hangs or died. ``/readyz`` is readiness: 200 when the server can answer a
recall at full speed, else 503, with the reason for each part:

1. ``database``: one ``select 1`` through the application's pool (within
   ``READY_PROBE_S``); a database out of reach is named without host or port;
2. ``models``: the query model (and cross-encoder, where present) loaded and every
   stage of a recall run once (``Recaller.warm_up``); ``engram serve`` and ``engram up``
   do it at start, in a thread, and log ``ready`` when it is done;
3. ``components``: each long-running part of the process (``orchestrator.health``: under
   ``engram up`` the embedding worker and the derive schedule), ready when ``ok`` or
   ``off``;
4. ``issuers``: each trusted issuer's key set (``ok``, ``retrying`` while cached keys still
   answer, ``failing``). Shown, but it does not hold readiness back: tokens signed by keys
   already cached keep verifying, and a token the server cannot check is a clear 401;
5. ``bookkeeping``: what went wrong in the recall background thread of the process since it
   started (``recall/access.py``, ``audit/chainer.py``): failed chaining rounds, access
   counts dropped (their reader gone), usage rows dropped (their reader gone) and poisoned
   (refused by the database, skipped; the log says why). Failures only: this endpoint
   answers anyone, so it shows no volume (how many receipts, counts or usage rows were
   written would tell an unauthenticated caller how much every tenant recalls). Shown,
   never holding readiness back.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text

from orchestrator.auth.tokens import TokenVerifier
from orchestrator.errors import describe_unavailable, is_unavailable
from orchestrator.health import Backoff, Health
from orchestrator.recall import Recaller

log = logging.getLogger("engram.api.health")

READY_PROBE_S = 3.0


@dataclass
class Warmup:
    """The state of the models' load and warm-up: not started, running, done or failed."""

    state: str = "not started"
    detail: str = ""
    seconds: float | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)

    def run(self, recaller: Recaller, verifier: TokenVerifier | None = None) -> None:
        """Load the models and warm every stage of a recall (blocking; call it in a thread)."""
        from orchestrator.api.schema import build_schema

        self.state = "loading"
        started = time.monotonic()
        backoff = Backoff(1.0, 30.0)
        while True:
            try:
                build_schema()
                self.stages_ms = recaller.warm_up()
                clock = time.perf_counter()
                for keys in (verifier.issuers.values() if verifier else ()):
                    keys.prefetch()
                self.stages_ms["issuers"] = (time.perf_counter() - clock) * 1000.0
                break
            except Exception as exc:
                if is_unavailable(exc):
                    # The models are loaded; the statement's warm-up waits for the database.
                    self.state, self.detail = "waiting for the database", describe_unavailable(exc)
                    time.sleep(backoff.delay())
                    continue
                self.state = "failed"
                self.detail = f"{type(exc).__name__}: {exc}".split("\n")[0][:300]
                log.exception("loading the models failed; recalls load them on first use")
                return
        self.seconds = time.monotonic() - started
        self.state = "loaded"
        self.detail = ", ".join(f"{k} {v:.0f} ms" for k, v in self.stages_ms.items())

    def start(self, recaller: Recaller, verifier: TokenVerifier | None = None,
              on_done: Any = None) -> threading.Thread:
        def body() -> None:
            self.run(recaller, verifier)
            if on_done is not None:
                on_done(self)

        thread = threading.Thread(target=body, name="engram-warm-up", daemon=True)
        thread.start()
        return thread


def database_status(engine: Engine) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        with engine.begin() as conn:  # committed: a ROLLBACK drops the pooled connection's
            conn.execute(text("select 1"))  # prepared statements (psycopg), recall's plans too
    except Exception as exc:
        return {"ok": False, "detail": describe_unavailable(exc)}
    return {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 1)}


def readiness(engine: Engine, warmup: Warmup, recaller: Recaller, health: Health | None,
              verifier: TokenVerifier) -> dict[str, Any]:
    """The readiness report (blocking: it asks the database)."""
    database = database_status(engine)
    models_ok = warmup.state == "loaded" or recaller.warmed
    models: dict[str, Any] = {"ok": models_ok, "state": "loaded" if models_ok else warmup.state}
    if warmup.detail:
        models["detail"] = warmup.detail
    components = {c.name: c.to_json() for c in (health.components() if health else [])}
    components_ok = all(c.healthy for c in (health.components() if health else []))
    issuers = {name: keys.status() for name, keys in verifier.issuers.items()}
    return {"ready": bool(database["ok"] and models_ok and components_ok), "database": database,
            "models": models, "components": components, "issuers": issuers,
            "bookkeeping": bookkeeping(recaller)}


def bookkeeping(recaller: Recaller) -> dict[str, int]:
    """The recall background's failure counters (see the module docstring, item 5)."""
    return {"chain_failures": int(recaller.chainer.failures),
            "access_counts_dropped": recaller.access.dropped,
            "usage_rows_dropped": recaller.usage.dropped,
            "usage_rows_poisoned": recaller.usage.poisoned}
