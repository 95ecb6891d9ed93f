"""``engram worker``: run the embedding queue, or serve embed/rerank over HTTP.

``run`` drains the queue and then listens (NOTIFY, with polling as fallback);
``run --once`` drains and exits, with a progress bar and rows/s on a terminal
and a one-line summary either way (scripts and tests read it). ``run`` also
extracts new chunks right after it embeds them (a thread woken by the queue;
``orchestrator.derive.extract.ExtractOnIngest``; ``--no-extract`` turns it off),
runs the derive jobs (``orchestrator.derive.jobs``) for every tenant, as the
service identity, in a thread of their own every ``ENGRAM_DERIVE_INTERVAL_S``,
and appends the recall receipts other processes left queued to the chain
(``orchestrator.audit.chainer``). ``run_worker`` is that loop, and ``engram up``
runs the very same one in a thread (``orchestrator.cli.serve.start_worker``).
Every loop reconnects with back-off when the database goes away and reports its
state in a ``Health`` component (``/readyz`` under ``engram up``).
``--once --derive`` drains, runs them once, and drains what they wrote.
``serve`` starts the HTTP service of ``orchestrator.worker.server``.
"""

from __future__ import annotations

import signal
import sys
import threading
import uuid
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text
from sqlalchemy.exc import DBAPIError

from orchestrator.cli.logs import configure_logging
from orchestrator.cli.output import console, styled
from orchestrator.config import Settings
from orchestrator.errors import EngramError, describe_unavailable, is_unavailable
from orchestrator.health import Component, Health

if TYPE_CHECKING:  # imported lazily at run time: `engram worker --help` stays fast
    from collections.abc import Callable

    from sqlalchemy import Engine

    from orchestrator.db.engine import Database
    from orchestrator.derive.jobs import DeriveScheduler
    from orchestrator.worker.queue import BatchReport, QueueWorker

worker_app = typer.Typer(help="The Torch worker: embedding queue and embed/rerank service.",
                         no_args_is_help=True)
out = console()
err = console(stderr=True)


def _fail(message: str) -> None:
    err.print(styled("error:", "red", f" {message}"))
    raise typer.Exit(1)


@worker_app.command("run")
def run(
    once: Annotated[bool, typer.Option("--once", help="Drain the queue, then exit.")] = False,
    tenant: Annotated[list[str] | None, typer.Option(
        "--tenant", help="Only this tenant's rows (tenant id; repeatable).")] = None,
    derive: Annotated[bool | None, typer.Option(
        "--derive/--no-derive", help="Also run the derive jobs for every tenant: by default on for "
        "`run` (every ENGRAM_DERIVE_INTERVAL_S; 0 turns it off), off for --once.")] = None,
    extract: Annotated[bool, typer.Option(
        "--extract/--no-extract", help="Extract new chunks right after embedding them (`run` "
        "only; what `engram ingest` leaves to the worker).")] = True,
) -> None:
    """Embed pending rows (chunks, facts, ...) as engram_worker; then wait for more."""
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.worker.embedder import Embedder
    from orchestrator.worker.queue import QueueWorker

    settings = Settings()
    configure_logging(settings)
    try:
        tenants = [uuid.UUID(t) for t in tenant] if tenant else None
    except ValueError as exc:
        _fail(f"--tenant takes a tenant id (a UUID): {exc}")
        return
    try:
        db = Database(settings)
        engine = make_app_engine(db.role_url("engram_worker"), pool_size=2)
        embedder = Embedder.from_settings(settings)
        worker = QueueWorker(engine, embedder, settings, tenants=tenants,
                             loader=lambda model: Embedder.for_model(settings, model))
        worker.follow_model()
        if isinstance(worker.embedder, Embedder):
            embedder = worker.embedder  # the active model's, once followed
    except EngramError as exc:
        _fail(str(exc))
        return
    except DBAPIError as exc:
        if once or not is_unavailable(exc):
            raise
        # `run` waits for the database (with back-off) instead of exiting: a worker started
        # beside a server that is still starting, or restarting, simply begins a little later.
        err.print(styled("worker:", "yellow", f" {describe_unavailable(exc)}; waiting for it"))
    err.print(f"worker: {embedder.model_name} ({embedder.dimension}-d) on {embedder.device.device}"
              f" ({embedder.device.reason})")
    if derive and not once and settings.derive_interval_s <= 0:
        _fail("--derive needs ENGRAM_DERIVE_INTERVAL_S > 0 (the seconds between derive ticks)")
    wanted = derive if derive is not None else (not once and settings.derive_interval_s > 0)
    scheduler = _derive_scheduler(db, engine, settings, tenants, verbose=True) if wanted and once else None
    stop = threading.Event()
    health = Health()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if once:
            _drain_once(worker, stop)
            if scheduler is not None:
                scheduler.tick()
                _drain_once(worker, stop)  # what the jobs wrote waits for its embedding
        else:
            err.print("worker: draining, then listening for new rows (Ctrl-C stops); it reconnects "
                      "with back-off when the database goes away")
            run_worker(db, engine, worker, settings, stop, health, tenants=tenants, derive=wanted,
                       extract=extract, say=lambda line: err.print(line))
    except KeyboardInterrupt:
        stop.set()
    except EngramError as exc:
        _fail(str(exc))
    finally:
        stop.set()
        engine.dispose()
        if scheduler is not None:
            scheduler.app_engine.dispose()


def run_worker(db: Database, engine: Engine, worker: QueueWorker, settings: Settings,
               stop: threading.Event, health: Health, *, tenants: list[uuid.UUID] | None = None,
               derive: bool, extract: bool, say: Callable[[str], None]) -> None:
    """The worker until ``stop``: embed the queue, extract what it embedded, run the derive
    jobs, chain the receipts other processes left queued. The one loop of `engram worker run`
    and `engram up`; each part is a ``health`` component (embedding worker, derive schedule,
    extraction on ingest) that reconnects with back-off and says when it is failing or dead."""
    from orchestrator.audit.chainer import ReceiptChainer
    from orchestrator.db.engine import make_app_engine

    schedule = health.component("derive schedule")
    scheduler = _derive_scheduler(db, engine, settings, tenants, verbose=False) if derive else None
    if scheduler is not None:
        say(f"worker: derive jobs every {settings.derive_interval_s:g}s for every tenant as "
            "service:derive")
        threading.Thread(target=scheduler.run_forever, args=(stop, schedule), name="engram-derive",
                         daemon=True).start()
    else:
        schedule.off("off (ENGRAM_DERIVE_INTERVAL_S is 0)" if settings.derive_interval_s <= 0
                     else "off (--no-derive)" if not derive else "off (engram_app cannot be reached)")
    extractor_app: Engine | None = None
    on_batch = None
    on_notify: dict[str, Callable[[str], None]] = {}
    extraction = health.component("extraction on ingest")
    if extract:
        try:
            extractor_app = make_app_engine(db.app_url(), pool_size=2)
        except EngramError as exc:
            say(f"worker: extraction off: {exc}")
            extraction.off(f"off ({exc})")
        if extractor_app is not None:
            on_batch, on_notify = _extract_on_ingest(engine, extractor_app, settings, tenants,
                                                     stop, say, extraction)
    else:
        extraction.off("off (--no-extract)")
    # Receipts a killed recall process left sealed but unchained (migration 0040); and, on
    # the same beat, the BM25 df deltas folded (0041), so a recall unnests few of them.
    chainer = ReceiptChainer(engine, interval_s=max(settings.recall_chain_interval_s, 1.0))
    chainer.tasks.append(lambda: fold_lexical_terms(engine, settings.recall_fold_min_deltas))
    chainer.start()
    try:
        worker.run_forever(db.psql_url("engram_worker"), stop, on_batch=on_batch,
                           component=health.component("embedding worker"), on_notify=on_notify)
    finally:
        stop.set()
        chainer.close()
        for app_engine in (extractor_app, scheduler.app_engine if scheduler else None):
            if app_engine is not None:
                app_engine.dispose()


def _derive_scheduler(db: Database, worker_engine: Engine, settings: Settings,
                      tenants: list[uuid.UUID] | None, *, verbose: bool) -> DeriveScheduler | None:
    """The derive scheduler, or None (said) when engram_app cannot be reached: embedding goes on."""
    from orchestrator.db.engine import make_app_engine
    from orchestrator.derive.jobs import DeriveScheduler, JobResult, TickReport

    try:
        app_engine = make_app_engine(db.app_url(), pool_size=2)
    except EngramError as exc:
        err.print(styled("worker: derive jobs off:", "yellow", f" {exc}"))
        return None

    def on_result(r: JobResult) -> None:
        if verbose or not r.ok:
            state = ("ok", "") if r.ok else ("failed", "red")
            err.print(Text.assemble(f"derive {r.tenant}: {r.job}: ", state, f": {r.line}"))
        for note in r.notes:
            err.print(Text.assemble(f"derive {r.tenant}: {r.job}: ", ("note:", "yellow"), f" {note}"))

    def on_tick(t: TickReport) -> None:
        (out if verbose else err).print(f"derived {t.line()}")

    return DeriveScheduler(worker_engine, app_engine, settings, tenants=tenants, on_result=on_result,
                           on_tick=on_tick)


def fold_lexical_terms(engine: Engine, min_deltas: int) -> int:
    """Fold the BM25 df deltas of tenants with at least ``min_deltas`` of them (0041)."""
    from sqlalchemy import func, select

    with engine.begin() as conn:
        return int(conn.execute(select(func.recall.fold_lexical_terms(min_deltas))).scalar_one())


def _extract_on_ingest(worker_engine: Engine, app_engine: Engine, settings: Settings,
                       tenants: list[uuid.UUID] | None, stop: threading.Event,
                       say: Callable[[str], None], component: Component
                       ) -> tuple[Callable[[BatchReport], None], dict[str, Callable[[str], None]]]:
    """A thread that extracts new chunks as soon as the queue has embedded them (it woke on
    their NOTIFY), or when ``engram ingest`` asks (``EXTRACT_CHANNEL``: chunks to read again
    that need no embedding); returns the queue's batch callback and the channel's, both
    waking it."""
    from orchestrator.derive.extract import EXTRACT_CHANNEL, ExtractOnIngest, backend_for

    extractor = ExtractOnIngest(worker_engine, app_engine, settings, tenants=tenants)
    choice = backend_for(settings)
    say(f"worker: new chunks are extracted right after embedding; entities by {choice.description}")
    if choice.notice:
        say(f"worker: note: {choice.notice}")
    threading.Thread(target=extractor.run_forever, args=(stop, component), name="engram-extract",
                     daemon=True).start()

    def on_batch(b: BatchReport) -> None:
        if b.table == "sources.chunks" and b.claimed:
            extractor.wake()

    return on_batch, {EXTRACT_CHANNEL: lambda _payload: extractor.wake()}


def _drain_once(worker: object, stop: threading.Event) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from orchestrator.worker.queue import DrainReport, QueueWorker

    assert isinstance(worker, QueueWorker)
    total = worker.pending()
    report: DrainReport
    if sys.stderr.isatty():
        columns = (TextColumn("embedding"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TextColumn("{task.fields[rate]:.0f} rows/s"), TimeElapsedColumn())
        with Progress(*columns, console=err) as progress:
            task = progress.add_task("embed", total=total, rate=0.0)

            def on_batch(b: BatchReport) -> None:
                done = progress.tasks[0].completed + b.embedded_rows + b.failed
                elapsed = progress.tasks[0].elapsed or 0.0
                progress.update(task, completed=done,
                                rate=done / elapsed if elapsed > 0 else 0.0)

            report = worker.drain(on_batch=on_batch, stop=stop)
    else:
        report = worker.drain(stop=stop)
    out.print(
        f"embedded {report.rows} rows in {report.seconds:.1f}s ({report.rows_per_s:.0f} rows/s): "
        f"model texts {report.model_texts}, cache hits {report.cache_hits}, "
        f"retries scheduled {report.retried}, failed {report.failed}")


@worker_app.command("serve")
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (ENGRAM_WORKER_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (ENGRAM_WORKER_PORT).")] = None,
) -> None:
    """Serve /embed, /rerank, /healthz, /readyz and /metrics with dynamic micro-batching."""
    import uvicorn

    from orchestrator.worker.server import create_app

    settings = Settings()
    app = create_app(settings)
    uvicorn.run(app, host=host or settings.worker_host, port=port or settings.worker_port,
                log_level="info")
