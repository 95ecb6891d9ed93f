"""One bad item never stops the rest: how a derive job skips, counts and shows a poisoned item.

Order of work (``run_guarded``):

1. the job runs as it always does, in one transaction; an ``item`` block costs nothing;
2. when that run fails for any reason but the database being out of reach, the job runs
   again in a new transaction, **item by item**: each ``item`` block is a savepoint, and an
   item whose work raises is rolled back alone, recorded as skipped with its reason, and
   the job goes on with the next one (jobs that write in bulk ask ``careful()`` and write
   one item per block);
3. what a job leaves out on purpose (an entity mention too long to be a name) it records
   with ``skip``, in either run;
4. the caller gets the job's result and the skipped items, and shows them: the log, the
   job's report line and notes (``engram derive`` prints them), and ``record_run`` keeps
   failed runs and runs that skipped something in ``memory.job_runs`` (migration
   ``0030_job_runs``), which readers of every scope the run covered may read.

Why a second run and not a savepoint per item always: a savepoint costs two round trips,
and past 64 subtransactions in one transaction every concurrent snapshot has to consult
``pg_subtrans`` (the per-backend cache overflows), which would slow recall while a big job
runs. Poisoned items are rare; the run without them pays nothing.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from orchestrator.errors import EngramError, is_unavailable

log = logging.getLogger("engram.derive.poison")

T = TypeVar("T")
SessionFactory = Callable[[], AbstractContextManager[Session]]
# memory.job_runs keeps at most this many skipped items per run (the count is exact).
MAX_PROBLEMS = 100


@dataclass(frozen=True)
class Skipped:
    """An item a job left out: what it is (no content, only where to find it) and why."""

    item: str
    reason: str

    def __str__(self) -> str:
        return f"skipped {self.item}: {self.reason}"

    def to_json(self) -> dict[str, str]:
        return {"item": self.item[:500], "reason": self.reason[:1000]}


@dataclass
class Guard:
    careful: bool = False
    skipped: list[Skipped] = field(default_factory=list)


_guard: ContextVar[Guard | None] = ContextVar("engram_derive_guard", default=None)


def reason_of(exc: BaseException) -> str:
    """Why an item failed, in one line: a database refusal by its message, else the exception."""
    if isinstance(exc, DBAPIError):
        from orchestrator.db.session import translate

        exc = translate(exc)
    if isinstance(exc, EngramError):
        return f"{exc.message} ({exc.code})"
    return f"{type(exc).__name__}: {exc}".split("\n")[0][:1000]


def careful() -> bool:
    """Whether this run goes item by item (jobs that write in bulk then write one at a time)."""
    guard = _guard.get()
    return guard is not None and guard.careful


def skip(item: str, reason: str) -> None:
    """Record an item the job leaves out on purpose (logged even outside ``run_guarded``)."""
    found = Skipped(item, reason)
    log.warning("%s", found)
    guard = _guard.get()
    if guard is not None:
        guard.skipped.append(found)


@dataclass
class Outcome:
    """What became of one ``item`` block: ``skipped`` after a failure in the careful run."""

    skipped: bool = False


@contextmanager
def item(session: Session, label: str, *, restore: Any = None) -> Iterator[Outcome]:
    """One item's work. In the item-by-item run, a failure rolls back this item alone, is
    recorded, and the block ends without raising (the yielded ``Outcome`` says so);
    ``restore`` (a report the item's work counts into) gets its counts back. Otherwise the
    block is transparent."""
    outcome = Outcome()
    guard = _guard.get()
    if guard is None or not guard.careful:
        yield outcome
        return
    saved = copy.deepcopy(restore) if restore is not None else None
    savepoint = session.begin_nested()
    try:
        yield outcome
    except Exception as exc:
        if is_unavailable(exc):
            raise
        if savepoint.is_active:
            savepoint.rollback()
        if saved is not None:
            restore.__dict__.update(saved.__dict__)
        outcome.skipped = True
        skip(label, reason_of(exc))
    else:
        savepoint.commit()


def run_guarded(sessions: SessionFactory, work: Callable[[Session], T], *,
                what: str) -> tuple[T, list[Skipped]]:
    """``work`` in one transaction from ``sessions``; if it fails (not for want of a database),
    once more item by item (see the module docstring). Returns its result and what it skipped;
    raises what the second run raises."""
    guard = Guard()
    token = _guard.set(guard)
    try:
        try:
            with sessions() as session:
                return work(session), guard.skipped
        except Exception as exc:
            if is_unavailable(exc):
                raise
            log.warning("%s failed (%s); running it again item by item", what, reason_of(exc))
        guard = Guard(careful=True)
        _guard.set(guard)
        with sessions() as session:
            return work(session), guard.skipped
    finally:
        _guard.reset(token)


def record_run(sessions: SessionFactory, job: str, *, ok: bool, line: str,
               skipped: Sequence[Skipped], started_at: datetime, keep_days: int = 30) -> None:
    """Keep a run that failed or skipped something in ``memory.job_runs`` (in its own
    transaction, shared into every scope the identity may write). Never raises: the run's
    own report already says everything; a run the database cannot take is logged."""
    try:
        with sessions() as session:
            session.execute(text(
                "insert into memory.job_runs (job, ok, line, skipped, problems, scopes, started_at) "
                "select :job, :ok, :line, :n, cast(:problems as jsonb), s, :started "
                "from (select auth.write_scopes() as s) w where cardinality(w.s) > 0"),
                {"job": job, "ok": ok, "line": line[:2000], "n": len(skipped),
                 "problems": _json([s.to_json() for s in skipped[:MAX_PROBLEMS]]),
                 "started": started_at})
            # The service prunes its tenant's old runs as it goes.
            session.execute(text(
                "delete from memory.job_runs where (select auth.is_service()) "
                "and finished_at < now() - make_interval(days => :d)"), {"d": keep_days})
    except Exception as exc:
        log.warning("could not keep the %s run in memory.job_runs: %s", job, reason_of(exc))


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)
