"""The derive jobs, in dependency order, and the scheduler that runs them for every tenant.

``JOBS`` is the one registry, each job fed by the ones before it:

====================  =========================================================
``lifecycle``         the lifecycle sweep: archives the documents past their
                      collection's policy (a policy set is the intent; with
                      ``derive_lifecycle_dry_run`` it only lists them), and logs
                      each one; first, so no job after it builds on them
``extract``           entities and low-confidence claims from chunks not yet read
                      (``engram worker run`` also extracts right after it embeds
                      new chunks: ``orchestrator.derive.extract.ExtractOnIngest``)
``conflicts``         ``knowledge.detect_conflicts()`` over the whole tenant; the
                      summary says how many conflicts are new
``consolidate``       observations from corroborating claims
``episodes``          private episodes from working-memory sessions
``decisions``         decision records and causal links from marked items
``communities``       the Louvain hierarchy of the entity graph
``profiles``          person, perspective and user profiles
``raptor``            the RAPTOR trees, incrementally; from scratch when
                      ``derive_raptor_full_every_s`` is set and the tenant's last
                      full rebuild (its ``derive.raptor`` activity) is older
``usage``             ``usage_daily`` and ``value_daily`` for yesterday and today
                      (only changed rows)
====================  =========================================================

Each job of each tenant is **one transaction**: a job that fails (or a process
killed mid-job) rolls back only that job, and is retried on the next tick;
every job is idempotent and incremental, so the retry resumes where the last
committed run ended. A failing job is logged and reported and the next job runs
anyway. Each run that writes anything is one provenance activity
(``derive.<job>``); a run that finds nothing to do writes nothing at all.

``DeriveScheduler`` runs the registry for every tenant as the service identity
(``orchestrator.derive.service``) every ``derive_interval_s`` seconds, in its own
thread beside the embedding queue (``engram worker run``), so neither holds the
other up. ``engram derive all`` runs it once for a token's tenant, as that
token's identity. The scheduler keeps each job's last result per tenant in
memory only (``DeriveScheduler.last_runs``): every job is idempotent, so a
restarted worker simply runs everything on its first tick. The one schedule that
must survive a restart, RAPTOR's periodic full rebuild, reads its last run from
the provenance activities in the database.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity
from orchestrator.config import Settings
from orchestrator.derive import poison
from orchestrator.derive.service import ServiceTenant, service_session, service_tenants
from orchestrator.errors import Unavailable, describe_unavailable, is_unavailable
from orchestrator.health import Backoff, Component, supervise

if TYPE_CHECKING:
    from orchestrator.derive.communities import CommunityReport
    from orchestrator.derive.profiles import ProfileReport

log = logging.getLogger("engram.derive.jobs")

SessionFactory = Callable[[], AbstractContextManager[Session]]


@dataclass(frozen=True)
class Outcome:
    """What a job run did: its summary line, notes worth a user's attention (logged as
    warnings), and details for the log (logged at info, e.g. each archived document)."""

    line: str
    notes: tuple[str, ...] = ()
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class Job:
    name: str
    help: str
    run: Callable[[Session, Settings], Outcome]


@dataclass(frozen=True)
class JobResult:
    job: str
    tenant: str
    ok: bool
    line: str
    seconds: float
    notes: tuple[str, ...] = ()
    unavailable: bool = False  # failed because the database was out of reach

    def render(self) -> str:
        state = "ok" if self.ok else "FAILED"
        return f"{self.tenant}\t{self.job}\t{state}\t{self.seconds:.2f}s\t{self.line}"


def _lifecycle(session: Session, settings: Settings) -> Outcome:
    from orchestrator.derive.lifecycle import sweep

    apply = not settings.derive_lifecycle_dry_run
    # A sweep that archives nothing leaves no activity behind (the savepoint rolls it back).
    savepoint = session.begin_nested()
    begin_activity(session, "derive.lifecycle", {"apply": apply})
    r = sweep(session, apply=apply)
    if apply and r.items:
        end_activity(session)
        savepoint.commit()
    else:
        savepoint.rollback()
    verb = "archived" if apply else "would archive"
    details = tuple(f"{verb} {it.collection}/{it.path} ({it.document_id}): last used "
                    f"{it.last_used_at.isoformat()}, policy {it.archive_after_days} days, "
                    f"{it.uses} uses on {it.days_used} days" for it in r.items)
    dry = "" if apply else " (dry run: ENGRAM_DERIVE_LIFECYCLE_DRY_RUN)"
    return Outcome(f"lifecycle: {len(r.items)} documents {verb}{dry}", details=details)


def _extract(session: Session, settings: Settings) -> Outcome:
    from orchestrator.derive.extract import extract

    r = extract(session, limit=settings.derive_extract_limit, settings=settings)
    return Outcome(r.line(), (r.notice,) if r.notice else ())


def _conflicts(session: Session, settings: Settings) -> Outcome:
    from orchestrator.ingest.knowledge import detect_conflicts

    # The activity is begun first so the new conflict rows name it; a sweep that
    # finds nothing rolls the savepoint back, so a quiet tick writes nothing.
    savepoint = session.begin_nested()
    begin_activity(session, "derive.conflicts", {})
    found = detect_conflicts(session)
    if found:
        end_activity(session)
        savepoint.commit()
    else:
        savepoint.rollback()
    return Outcome(f"{found} new conflicts")


def _consolidate(session: Session, settings: Settings) -> Outcome:
    from orchestrator.derive.consolidate import consolidate

    r = consolidate(session, min_evidence=settings.derive_consolidate_min_evidence, settings=settings)
    return Outcome(f"observations: {r.inserted} inserted, {r.updated} updated, {r.deleted} deleted, "
                   f"{r.unchanged} unchanged; {r.recallable} recallable (>= 0.65)")


def _episodes(session: Session, settings: Settings) -> Outcome:
    from orchestrator.derive.episodes import build

    r = build(session, settings=settings)
    return Outcome(f"episodes: {r.inserted} inserted, {r.updated} updated from {r.items} new items "
                   f"in {r.sessions} sessions")


def _decisions(session: Session, settings: Settings) -> Outcome:
    from orchestrator.derive.decisions import record

    r = record(session)
    return Outcome(f"decisions: {r.recorded} recorded, {r.updated} updated, {r.links} links, "
                   f"{len(r.problems)} problems", tuple(r.problems))


def communities_line(r: CommunityReport) -> str:
    """The one summary line of a communities run (the job's and ``engram derive communities``')."""
    levels = ", ".join(f"level {lv}: {c.inserted + c.updated + c.unchanged + c.relinked}"
                       for lv, c in sorted(r.levels.items()))
    return (f"{r.scope_sets} scope sets: {r.inserted} inserted, {r.updated} updated, {r.deleted} deleted, "
            f"{r.unchanged} unchanged, {r.relinked} relinked; {r.resummarised} summarised"
            + (f" ({levels})" if levels else ""))


def profiles_line(r: ProfileReport) -> str:
    return (f"profiles: {r.inserted} inserted, {r.updated} updated, {r.deleted} deleted, "
            f"{r.unchanged} unchanged; {r.resummarised} summarised, {r.users} of users"
            + (f"; {r.withheld} withheld (subject not shared into every scope of its claims)"
               if r.withheld else ""))


def _communities(session: Session, settings: Settings) -> Outcome:
    from orchestrator.derive.communities import rebuild

    return Outcome(communities_line(rebuild(session, settings=settings)))


def _profiles(session: Session, settings: Settings) -> Outcome:
    from orchestrator.derive.profiles import refresh

    return Outcome(profiles_line(refresh(session, settings=settings)))


def last_full_raptor(session: Session) -> datetime | None:
    """When this tenant's RAPTOR trees were last rebuilt from scratch (its activities say)."""
    found: datetime | None = session.execute(text(
        "select max(started_at) from provenance.activities "
        "where kind = 'derive.raptor' and detail @> '{\"full\": true}'")).scalar()
    return found


def _raptor(session: Session, settings: Settings) -> Outcome:
    from orchestrator.derive.raptor import build

    every = settings.derive_raptor_full_every_s
    full = False
    if every > 0:
        last = last_full_raptor(session)
        full = last is None or datetime.now(UTC) - last >= timedelta(seconds=every)
    r = build(session, full=full, settings=settings)
    return Outcome(f"raptor{' (full rebuild)' if full else ''}: {r.scope_sets} scope sets, "
                   f"{r.inserted} inserted, {r.updated} updated, {r.deleted} deleted, "
                   f"{r.unchanged} unchanged, {r.resummarised} re-summarised, {r.joined} joined a leaf")


def _usage(session: Session, settings: Settings) -> Outcome:
    today = datetime.now(UTC).date()
    days = (today - timedelta(days=1), today)  # yesterday's last events land after midnight
    savepoint = session.begin_nested()
    begin_activity(session, "derive.usage", {"days": [d.isoformat() for d in days]})
    counts = {"usage_daily": 0, "value_daily": 0}
    # Each table and day is one statement of a SECURITY DEFINER function (it counts every
    # user's ledger rows): item by item (poison), one the database refuses is skipped alone.
    for table, refresh in (("usage_daily", func.memory.refresh_usage),
                           ("value_daily", func.memory.refresh_value)):
        for d in days:
            with poison.item(session, f"memory.{table} of {d.isoformat()}"):
                counts[table] += int(session.execute(select(refresh(d))).scalar_one())
    usage, value = counts["usage_daily"], counts["value_daily"]
    if usage or value:
        end_activity(session)
        savepoint.commit()
    else:
        savepoint.rollback()
    return Outcome(f"usage_daily: {usage} rows changed, value_daily: {value} rows changed "
                   f"({days[0].isoformat()}, {days[1].isoformat()})")


JOBS: tuple[Job, ...] = (
    Job("lifecycle", "archive documents past their collection's policy", _lifecycle),
    Job("extract", "entities and claims from chunks not yet read", _extract),
    Job("conflicts", "detect value, time and relation conflicts", _conflicts),
    Job("consolidate", "observations from corroborating claims", _consolidate),
    Job("episodes", "private episodes from working-memory sessions", _episodes),
    Job("decisions", "decision records and causal links from marked items", _decisions),
    Job("communities", "the community hierarchy of the entity graph", _communities),
    Job("profiles", "person, perspective and user profiles", _profiles),
    Job("raptor", "the RAPTOR summary trees", _raptor),
    Job("usage", "usage_daily and value_daily for yesterday and today", _usage),
)
JOBS_BY_NAME = {job.name: job for job in JOBS}


def run_job(job: Job, sessions: SessionFactory, settings: Settings, tenant: str) -> JobResult:
    """One job in one transaction; any failure is caught, logged and returned, never raised.

    An item the job cannot write does not fail it: the job runs again item by item and
    skips that item (``orchestrator.derive.poison``); what was skipped is in the result's
    line and notes, and the run, like a failed one, is kept in ``memory.job_runs``."""
    started = time.monotonic()
    started_at = datetime.now(UTC)
    keep = settings.derive_job_runs_keep_days
    try:
        outcome, skipped = poison.run_guarded(sessions, lambda s: job.run(s, settings),
                                              what=f"derive {tenant}: {job.name}")
    except Exception as exc:  # one failing job must not stop the others
        if is_unavailable(exc):
            log.warning("derive %s: %s: %s", tenant, job.name, describe_unavailable(exc))
            return JobResult(job.name, tenant, False, describe_unavailable(exc),
                             time.monotonic() - started, unavailable=True)
        log.exception("derive %s: %s failed", tenant, job.name)
        line = f"{type(exc).__name__}: {exc}".split("\n")[0]
        poison.record_run(sessions, job.name, ok=False, line=line, skipped=[], started_at=started_at,
                          keep_days=keep)
        return JobResult(job.name, tenant, False, line, time.monotonic() - started)
    line, notes = outcome.line, outcome.notes
    if skipped:
        line = f"{line}; {len(skipped)} skipped"
        notes = (*notes, *(str(s) for s in skipped))
        poison.record_run(sessions, job.name, ok=True, line=line, skipped=skipped, started_at=started_at,
                          keep_days=keep)
    for note in notes:
        log.warning("derive %s: %s: %s", tenant, job.name, note)
    for detail in outcome.details:
        log.info("derive %s: %s: %s", tenant, job.name, detail)
    return JobResult(job.name, tenant, True, line, time.monotonic() - started, notes=notes)


def run_jobs(sessions: SessionFactory, settings: Settings, tenant: str, *,
             jobs: Sequence[Job] = JOBS,
             on_result: Callable[[JobResult], None] | None = None) -> list[JobResult]:
    """Every job in registry order, each in its own transaction from ``sessions``."""
    results = []
    for job in jobs:
        result = run_job(job, sessions, settings, tenant)
        if on_result is not None:
            on_result(result)
        results.append(result)
    return results


@dataclass(frozen=True)
class LoggedRun:
    job: str
    ok: bool
    line: str
    seconds: float
    started_at: datetime


class RunLog:
    """The last runs of each tenant's jobs in this process, for the console's operations page
    (GraphQL ``deriveRuns``): the scheduler records every result, failures with their error."""

    def __init__(self, size: int = 200) -> None:
        self._size = size
        self._runs: dict[str, deque[LoggedRun]] = {}
        self._lock = threading.Lock()

    def record(self, result: JobResult) -> None:
        started = datetime.now(UTC) - timedelta(seconds=result.seconds)
        with self._lock:
            self._runs.setdefault(result.tenant, deque(maxlen=self._size)).append(
                LoggedRun(result.job, result.ok, result.line, result.seconds, started))

    def runs(self, tenant: str) -> list[LoggedRun]:
        """The tenant's (organization id) runs, newest first."""
        with self._lock:
            return list(reversed(self._runs.get(tenant, ())))


RUN_LOG = RunLog()


@dataclass
class TickReport:
    tenants: int = 0
    results: list[JobResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[JobResult]:
        return [r for r in self.results if not r.ok]

    def line(self) -> str:
        """"1 tenant, 10 jobs in 2.0s, 0 failed": the tick as its log line, the worker's line
        and its health say it."""
        jobs = len(self.results)
        return (f"{self.tenants} tenant{'s' * (self.tenants != 1)}, {jobs} job{'s' * (jobs != 1)}"
                f" in {self.seconds:.1f}s, {len(self.failed)} failed")


class DeriveScheduler:
    """Runs the registry for every tenant, as the service identity, on an interval.

    ``worker_engine`` logs in as ``engram_worker`` (it lists the tenants through
    ``auth.service_tenants()``); ``app_engine`` as ``engram_app`` (the jobs run
    there, under forced RLS, bound as ``service:derive``).
    """

    def __init__(self, worker_engine: Engine, app_engine: Engine, settings: Settings, *,
                 jobs: Sequence[Job] = JOBS, tenants: Sequence[uuid.UUID] | None = None,
                 on_result: Callable[[JobResult], None] | None = None,
                 on_tick: Callable[[TickReport], None] | None = None) -> None:
        self.worker_engine = worker_engine
        self.app_engine = app_engine
        self.settings = settings
        self.jobs = tuple(jobs)
        self.tenants = list(tenants) if tenants is not None else None
        self.on_result = on_result
        self.on_tick = on_tick
        # (tenant org id, job) -> its last result; in memory only (see the module docstring).
        self.last_runs: dict[tuple[str, str], JobResult] = {}
        self.last_tick_at: datetime | None = None

    def tenant_list(self) -> list[ServiceTenant]:
        with self.worker_engine.connect() as conn:
            return service_tenants(conn, self.tenants)

    def tick(self) -> TickReport:
        """One pass: every job of every tenant (tenants without scopes have nothing to derive)."""
        started = time.monotonic()
        report = TickReport()
        for tenant in self.tenant_list():
            if not tenant.scopes:
                continue
            report.tenants += 1

            def sessions(t: ServiceTenant = tenant) -> AbstractContextManager[Session]:
                return service_session(self.app_engine, t)

            report.results += run_jobs(sessions, self.settings, tenant.org_id, jobs=self.jobs,
                                       on_result=self._record)
            if any(r.unavailable for r in report.results):
                # The rest of the tick would fail the same way: run_forever retries it.
                raise Unavailable(detail=f"derive tick stopped at tenant {tenant.org_id}")
        self.compact_statistics()
        self.last_tick_at = datetime.now(UTC)
        report.seconds = time.monotonic() - started
        log.info("derive tick: %s", report.line())
        if self.on_tick is not None:
            self.on_tick(report)
        return report

    def _record(self, result: JobResult) -> None:
        self.last_runs[(result.tenant, result.job)] = result
        RUN_LOG.record(result)
        if self.on_result is not None:
            self.on_result(result)

    def compact_statistics(self) -> int:
        """Fold the BM25 statistic deltas of tenants with many of them (all tenants at once)."""
        try:
            with self.worker_engine.begin() as conn:
                done = int(conn.execute(select(func.recall.compact_all_lexical_stats(
                    self.settings.derive_compact_min_deltas))).scalar_one())
                # Every tenant's df deltas (0041), however few.
                conn.execute(select(func.recall.fold_lexical_terms(1)))
        except Exception:  # maintenance: a failure must not stop the derive jobs
            log.exception("derive tick: compacting the BM25 statistics failed")
            return 0
        if done:
            log.info("derive tick: compacted the BM25 statistics of %d tenants", done)
        return done

    def run_forever(self, stop: threading.Event, component: Component | None = None) -> None:
        """Tick, then wait ``derive_interval_s`` (or until ``stop``). A tick that fails (the
        database restarting, say) is retried with back-off, from a second up to the interval,
        not only at the next interval; ``component`` reports the state."""
        interval = max(self.settings.derive_interval_s, 1.0)
        component = component or Component("derive schedule")

        def body() -> None:
            while not stop.is_set():
                t = self.tick()
                component.ok(f"last tick: {t.line()}")
                stop.wait(interval)

        supervise(component, body, stop, backoff=Backoff(1.0, min(interval, 60.0)))
