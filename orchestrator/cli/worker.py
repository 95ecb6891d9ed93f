"""``engram worker``: run the embedding queue, or serve embed/rerank over HTTP.

``run`` drains the queue and then listens (NOTIFY, with polling as fallback);
``run --once`` drains and exits, with a progress bar and rows/s on a terminal
and a one-line summary either way (scripts and tests read it). ``serve`` starts
the HTTP service of ``orchestrator.worker.server``.
"""

from __future__ import annotations

import signal
import sys
import threading
import uuid
from typing import Annotated

import typer
from rich.console import Console

from orchestrator.config import Settings
from orchestrator.errors import EngramError

worker_app = typer.Typer(help="The Torch worker: embedding queue and embed/rerank service.",
                         no_args_is_help=True)
out = Console()
err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(1)


@worker_app.command("run")
def run(
    once: Annotated[bool, typer.Option("--once", help="Drain the queue, then exit.")] = False,
    tenant: Annotated[list[str] | None, typer.Option(
        "--tenant", help="Only this tenant's rows (tenant id; repeatable).")] = None,
) -> None:
    """Embed pending rows (chunks, facts, ...) as engram_worker; then wait for more."""
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.worker.embedder import Embedder
    from orchestrator.worker.queue import QueueWorker

    settings = Settings()
    try:
        tenants = [uuid.UUID(t) for t in tenant] if tenant else None
    except ValueError as exc:
        _fail(f"--tenant takes a tenant id (a UUID): {exc}")
        return
    try:
        db = Database(settings)
        engine = make_app_engine(db.role_url("engram_worker"), pool_size=2)
        embedder = Embedder.from_settings(settings)
        worker = QueueWorker(engine, embedder, settings, tenants=tenants)
        worker.check_model()
    except EngramError as exc:
        _fail(str(exc))
        return
    err.print(f"worker: {embedder.model_name} ({embedder.dimension}-d) on {embedder.device.device}"
              f" ({embedder.device.reason})", highlight=False)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if once:
            _drain_once(worker, stop)
        else:
            err.print("worker: draining, then listening for new rows (Ctrl-C stops)")
            worker.run_forever(db.psql_url("engram_worker"), stop)
    except KeyboardInterrupt:
        stop.set()
    except EngramError as exc:
        _fail(str(exc))
    finally:
        engine.dispose()


def _drain_once(worker: object, stop: threading.Event) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from orchestrator.worker.queue import BatchReport, DrainReport, QueueWorker

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
        f"retries scheduled {report.retried}, failed {report.failed}", highlight=False)


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
