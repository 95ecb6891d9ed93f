"""Bookkeeping of a recall written after it, in batches: served facts' access counters and
the usage rows of every recall and memory_prepare.

Why: ``knowledge.touch_claims`` updates every served claim, and a claim is a chained
row, so each bump is an UPDATE plus a chain event appended at COMMIT under the tenant's
chain lock: on the recall's path, and a lock every concurrent recall of the tenant that
served a fact waited in (7-10 ms of a small tenant's recall on the shared benchmark
machine). The counter is bookkeeping for lifecycle and ranking, not evidence, so the
recall records what it served and a background thread of the process (the receipt
chainer's, ``audit.chainer``) applies the counts moments later: one transaction per
reader, ``touch_claims`` under the reader's own identity (so only claims that reader may
read are counted, as before), a claim served n times counted n times.

The usage rows (``learning.usage_params``: a ``memory.rank_events`` row with the served and
pooled items' features, and a ``memory.usage_ledger`` row per served item) are the same kind
of bookkeeping, and were the same cost: both tables are chained, so every recall staged
about ten chain events and appended them at COMMIT under the tenant's chain lock (one
INSERT of 3.5-5 ms and 0.5 ms more at COMMIT, measured on the kept 10k benchmark corpus).
``UsageRows`` queues each recall's rows and writes them with the access counts: one
transaction per reader for every recall that reader made since the last flush, each
event under a savepoint, so one event the database refuses (counted in ``poisoned`` and
logged) never holds up the others, nor does one whose parameters cannot be written at all;
an outage, a deadlock, a serialization conflict or a busy lock (``errors.is_retryable``) is
nobody's row and keeps the reader's events, in order, for the next flush. A unique violation
is the event's own (it fails the same way every time) and is skipped like any refusal. An event's
``occurred_at`` is its write, moments after the recall; ``mark_used`` flushes the queue of
its process first, so feedback sent right after a recall still finds its event in the label
window (``rank_training_rows``).

The trade-offs, accepted: a process killed before its next flush (at most
``recall_chain_delay_s`` after a recall, or at exit) loses those bumps and usage rows (the
receipts, which are evidence, are never lost: migration 0040); and since the receipt is
sealed before the counter moves, a receipt that served facts reads *proven, changed since*
(the access counter) rather than *unchanged*, as it already did after the fact's next
recall.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.auth import Identity
from orchestrator.db.session import bound_session, translate
from orchestrator.errors import EngramError, is_retryable

log = logging.getLogger("engram.recall.access")
# What the database answers for an identity it no longer accepts: nothing later changes that.
REFUSED = frozenset({"FORBIDDEN", "UNAUTHENTICATED", "BAD_USER_INPUT", "NOT_FOUND"})
READER_REFUSED = -1  # _as_reader: the database no longer accepts the reader


def _as_reader(engine: Engine, identity: Identity, what: str,
               write: Callable[[Session], int]) -> int | None:
    """``write`` in one transaction bound to ``identity``: what it returns, READER_REFUSED
    when the database no longer accepts the reader (its tenant or a scope gone: nothing later
    changes that, so the work is dropped), or None when it failed otherwise (the database
    restarting: keep the work for the next flush)."""
    try:
        with bound_session(engine, identity) as session:
            return write(session)
    except EngramError as exc:
        if exc.code in REFUSED:
            log.warning("%s of %s dropped: %s", what, identity.org_id, exc)
            return READER_REFUSED
        log.warning("%s kept for the next flush: %s", what, exc)
    except Exception:
        log.warning("%s kept for the next flush", what, exc_info=True)
    return None


class AccessCounts:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._pending: dict[Identity, Counter[uuid.UUID]] = {}
        self._lock = threading.Lock()
        self.applied = 0
        self.dropped = 0

    def add(self, identity: Identity, claims: list[uuid.UUID]) -> None:
        with self._lock:
            self._pending.setdefault(identity, Counter()).update(claims)

    def flush(self) -> int:
        """Apply every pending count; returns how many bumps the database counted. A reader
        the database no longer accepts (its tenant or a scope gone) is dropped and counted in
        ``dropped``; anything else (the database restarting) is kept for the next flush."""
        with self._lock:
            pending, self._pending = self._pending, {}
        counted = 0
        for identity, counts in pending.items():
            def touch(session: Session, counts: Counter[uuid.UUID] = counts) -> int:
                # touch_claims counts each listed claim once: a claim served n times is
                # listed in n calls.
                done = 0
                for level in range(1, max(counts.values()) + 1):
                    ids = sorted((c for c, n in counts.items() if n >= level), key=str)
                    done += int(session.execute(
                        select(func.knowledge.touch_claims(ids))).scalar_one() or 0)
                return done

            done = _as_reader(self.engine, identity, "access counts", touch)
            if done is None:
                self._keep(identity, counts)
            elif done == READER_REFUSED:
                self.dropped += sum(counts.values())
            else:
                counted += done
        self.applied += counted
        return counted

    def _keep(self, identity: Identity, counts: Counter[uuid.UUID]) -> None:
        with self._lock:
            self._pending.setdefault(identity, Counter()).update(counts)


class UsageRows:
    """Each recall's usage rows (``learning.usage_params``), written in batches per reader."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._pending: dict[Identity, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time: events keep their order
        self.written = 0
        self.dropped = 0  # events of readers the database no longer accepts
        self.poisoned = 0  # events the database refused on their own (logged)

    def add(self, identity: Identity, params: dict[str, Any]) -> None:
        with self._lock:
            self._pending.setdefault(identity, []).append(params)

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._pending.values())

    def flush(self) -> int:
        """Write every queued event; returns how many were written."""
        from orchestrator.recall.learning import write_usage

        with self._flushing:
            with self._lock:
                pending, self._pending = self._pending, {}
            written = 0
            for identity, events in pending.items():
                poisoned: list[str] = []

                def write(session: Session, events: list[dict[str, Any]] = events,
                          poisoned: list[str] = poisoned) -> int:
                    done = 0
                    for params in events:
                        try:
                            with session.begin_nested():
                                write_usage(session, params)
                            done += 1
                        except DBAPIError as exc:
                            if is_retryable(exc):
                                raise  # not the event's fault: keep them all for a retry
                            poisoned.append(str(translate(exc)))
                        except Exception as exc:  # its parameters cannot be written at all
                            poisoned.append(f"{type(exc).__name__}: {exc}")
                    return done

                done = _as_reader(self.engine, identity, "usage rows", write)
                if done is None:
                    with self._lock:  # before anything queued since, to keep the order
                        self._pending[identity] = events + self._pending.get(identity, [])
                    continue
                if done == READER_REFUSED:
                    self.dropped += len(events)
                    continue
                for message in poisoned:
                    log.warning("a usage event of %s was refused and skipped: %s",
                                identity.org_id, message)
                self.poisoned += len(poisoned)
                written += done
            self.written += written
            return written
