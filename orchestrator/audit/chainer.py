"""Chaining queued recall receipts in batches, in a background thread (migration 0040).

A recall seals its receipt in its own transaction and queues the receipt's chain event
there (``provenance.receipt_queue``); nothing about the chain is on the recall's path.
``ReceiptChainer`` appends the queue to the chain: a moment (``delay_s``) after a recall
says it wrote a receipt, so a burst of recalls is chained in one transaction per tenant,
and every ``interval_s`` regardless, so that receipts a killed process left queued are
chained by whichever process runs next. It chains *every* tenant's queue, not only the
receipts of its own process; concurrent chainers queue on each tenant's chain lock and
never chain a receipt twice. ``close`` (also registered to run at exit) chains what is
left before the process ends.

While the database cannot be reached (restarting, or gone), the chainer backs off, doubling
its wait up to ``max_backoff_s``; it logs the first failure of an outage with its cause and
says when chaining resumes, instead of a traceback every ``interval_s``.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable

from sqlalchemy import Engine

from orchestrator.audit.receipts import chain_receipts

log = logging.getLogger("engram.audit.chainer")


class ReceiptChainer:
    def __init__(self, engine: Engine, *, delay_s: float = 0.05, interval_s: float = 2.0,
                 batch: int = 500, max_backoff_s: float = 60.0) -> None:
        self.engine = engine
        # More work of the same kind (deferred, batched, retried): run before each chaining.
        self.tasks: list[Callable[[], object]] = []
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.batch = batch
        self.max_backoff_s = max_backoff_s
        self.chained = 0
        self.failures = 0
        self.failing = 0  # consecutive failed rounds (0: chaining works)
        self._dirty = False  # woken since the last flush
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one flush at a time in this process

    def wake(self) -> None:
        """A receipt was committed (or a task has work): chain it, and whatever else waits,
        shortly."""
        self._dirty = True
        if self._thread is None:
            self.start()
        self._wake.set()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="engram-receipt-chainer",
                                            daemon=True)
            self._thread.start()
        atexit.register(self.close)

    def flush(self) -> int:
        """Chain every queued receipt now (all tenants); returns how many this call chained."""
        total = 0
        with self._lock:
            self._dirty = False
            for task in self.tasks:
                try:
                    task()
                except Exception:  # a failing task (access counts) never holds the chain back
                    self.failures += 1
                    log.warning("a background task before chaining failed; chaining anyway",
                                exc_info=True)
            while True:
                with self.engine.begin() as conn:
                    done = chain_receipts(conn, self.batch)
                total += done
                if done < self.batch:
                    break
        self.chained += total
        return total

    def close(self) -> None:
        """Stop the thread and chain what is left (a failure is logged: the queue keeps it)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if not self._dirty:
            return
        try:
            self.flush()
        except Exception:  # the database may be gone at exit; the queue keeps every receipt
            log.info("receipts left queued at exit; the next chainer appends them", exc_info=True)

    def wait_s(self) -> float:
        """How long the thread waits before its next round: ``interval_s``, doubled for each
        consecutive failed round up to ``max_backoff_s``."""
        if not self.failing:
            return self.interval_s
        return float(min(self.max_backoff_s, self.interval_s * 2 ** min(self.failing, 16)))

    def _run(self) -> None:
        while not self._stop.is_set():
            # While failing, a wake does not shorten the back-off (each recall wakes us).
            woken = (self._stop.wait(self.wait_s()) if self.failing
                     else self._wake.wait(self.interval_s))
            if self._stop.is_set():
                return
            if woken:
                self._stop.wait(self.delay_s)  # let the rest of a burst commit
            self._wake.clear()
            try:
                self.flush()
            except Exception as exc:  # e.g. the database restarting: a later round retries
                self.failures += 1
                self.failing += 1
                if self.failing == 1:
                    log.warning("chaining queued receipts failed (%s); retrying with back-off "
                                "up to %.0f s, receipts stay queued",
                                str(exc).splitlines()[0][:300], self.max_backoff_s)
                else:
                    log.debug("chaining queued receipts failed again (%d in a row)",
                              self.failing, exc_info=True)
            else:
                if self.failing:
                    log.info("chaining queued receipts resumed after %d failed rounds",
                             self.failing)
                self.failing = 0
