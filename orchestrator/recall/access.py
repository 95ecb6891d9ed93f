"""Access counters of served facts, bumped in batches after the recall.

Why: ``knowledge.touch_claims`` updates every served claim, and a claim is a chained
row, so each bump is an UPDATE plus a chain event appended at COMMIT under the tenant's
chain lock: on the recall's path, and a lock every concurrent recall of the tenant that
served a fact waited in (7-10 ms of a small tenant's recall on the shared benchmark
machine). The counter is bookkeeping for lifecycle and ranking, not evidence, so the
recall records what it served and a background thread of the process (the receipt
chainer's, ``audit.chainer``) applies the counts moments later: one transaction per
reader, ``touch_claims`` under the reader's own identity (so only claims that reader may
read are counted, as before), a claim served n times counted n times.

The trade-offs, accepted: a process killed before its next flush (at most
``recall_chain_delay_s`` after a recall, or at exit) loses those bumps (the receipts,
which are evidence, are never lost: migration 0040); and since the receipt is sealed
before the counter moves, a receipt that served facts reads *proven, changed since* (the
access counter) rather than *unchanged*, as it already did after the fact's next recall.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter

from sqlalchemy import Engine, func, select

from orchestrator.auth import Identity
from orchestrator.db.session import bound_session
from orchestrator.errors import EngramError

log = logging.getLogger("engram.recall.access")
# What the database answers for an identity it no longer accepts: nothing later changes that.
REFUSED = frozenset({"FORBIDDEN", "UNAUTHENTICATED", "BAD_USER_INPUT", "NOT_FOUND"})


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
            try:
                with bound_session(self.engine, identity) as session:
                    # touch_claims counts each listed claim once: a claim served n times is
                    # listed in n calls.
                    for level in range(1, max(counts.values()) + 1):
                        ids = sorted((c for c, n in counts.items() if n >= level), key=str)
                        counted += int(session.execute(
                            select(func.knowledge.touch_claims(ids))).scalar_one() or 0)
            except EngramError as exc:
                if exc.code in REFUSED:
                    self.dropped += sum(counts.values())
                    log.warning("access counts of %s dropped: %s", identity.org_id, exc)
                    continue
                self._keep(identity, counts)
                log.warning("access counts kept for the next flush: %s", exc)
            except Exception:
                self._keep(identity, counts)
                log.warning("access counts kept for the next flush", exc_info=True)
        self.applied += counted
        return counted

    def _keep(self, identity: Identity, counts: Counter[uuid.UUID]) -> None:
        with self._lock:
            self._pending.setdefault(identity, Counter()).update(counts)
