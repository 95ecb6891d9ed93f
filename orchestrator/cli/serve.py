"""``engram serve``: the GraphQL API under uvicorn.

The app connects only as ``engram_app``; ``engram up`` calls ``serve_engram``
after migrating, so that ``make up`` ends with Engram running: the embedding
worker in a thread of the same process (as ``engram_worker``) and the API in
the foreground.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Annotated

import typer

from orchestrator.cli.output import console, styled
from orchestrator.config import Settings
from orchestrator.health import Health

out = console()
log = logging.getLogger("engram.serve")


def production_gate(settings: Settings) -> None:
    """Refuse to start a production server that would be wrong (exit 2); print its warnings."""
    from orchestrator.config.production import check_production
    from orchestrator.errors import Misconfigured

    try:
        warnings = check_production(settings)
    except Misconfigured as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for warning in warnings:
        out.print(styled("warning:", "yellow", f" {warning}"))
    if settings.env == "production":
        off = [name for name, value in (("GraphiQL", settings.api_graphiql),
                                        ("introspection", settings.api_introspection)) if not value]
        out.print(f"production: tokens from {settings.auth_issuer} for {settings.auth_audience}; "
                  "development key not trusted" + (f"; {' and '.join(off)} off" if off else ""))


def load_settings() -> Settings:
    """``Settings()``, with a bad ``ENGRAM_*`` value reported as one clear line (exit 2)."""
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as exc:
        lines = [f"ENGRAM_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
                 for e in exc.errors()]
        typer.echo("error: bad settings: " + "; ".join(lines), err=True)
        raise typer.Exit(2) from exc


def serve_api(settings: Settings, host: str | None = None, port: int | None = None,
              health: Health | None = None) -> None:
    """The API in the foreground. It listens at once (``/healthz`` answers) and loads the models
    in a thread; ``/readyz`` says ready, and the log says so, when they are loaded and warm."""
    import uvicorn

    from orchestrator.api.app import create_app
    from orchestrator.api.health import Warmup
    from orchestrator.auth.tokens import TokenVerifier
    from orchestrator.cli.logs import configure_logging
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.recall import Recaller

    configure_logging(settings)
    # An operation may hold two connections at once (its request's session and the recall's
    # own), and the recall background one more: the pool keeps them all open, since an
    # overflow connection is closed on return and its successor plans the recall statement
    # again (40-60 ms per size class). The cap stays about what it was (2 x api_threads).
    engine = make_app_engine(Database(settings).app_url(), pool_size=2 * settings.api_threads + 2,
                             max_overflow=4)
    recaller = Recaller(engine, settings)
    verifier = TokenVerifier.from_settings(settings)
    warmup = Warmup()
    app = create_app(settings, engine, verifier, recaller=recaller, health=health, warmup=warmup)
    host = host or settings.api_host
    port = port or settings.api_port
    out.print(f"GraphQL API on http://{host}:{port}/graphql (loading the models; "
              f"GET /readyz says when it is ready)")
    out.print(f"Console on http://{host}:{port}/console")
    from orchestrator.console.routes import vendor_missing

    if vendor_missing():
        out.print(styled("console assets are missing:", "yellow",
                         " run `make assets` (npm ci) to build them"))

    def said(w: Warmup) -> None:
        if w.state == "loaded":
            log.info("ready: models loaded and every recall stage warmed in %.1f s (%s)",
                     w.seconds or 0.0, w.detail)
            out.print(f"ready: models loaded in {w.seconds or 0.0:.1f}s; serving recalls at full speed")
        else:
            out.print(styled("not ready:", "yellow", f" the models did not load ({w.detail}); "
                             "recalls load them on first use"))

    warmup.start(recaller, verifier, on_done=said)
    restore = _exit_on_sigterm()
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", lifespan="off")
    finally:
        restore()
        engine.dispose()


def _exit_on_sigterm() -> Callable[[], None]:
    """SIGTERM (docker stop, systemd, kill) ends the process as SystemExit(143) instead of the
    default abrupt exit: uvicorn shuts down gracefully, then raises the signal it caught again,
    and with the default action nothing after it would run (the engine's pool left open, `engram
    up`'s closing words unsaid). Only from the main thread, and only over the default action.
    Returns what puts the default action back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return restore


def start_worker(settings: Settings, health: Health) -> tuple[threading.Thread, threading.Event] | None:
    """The worker in a thread of this process (``engram up``): the very loop of ``engram worker
    run`` (``orchestrator.cli.worker.run_worker``): embedding, extraction right after it,
    the derive jobs when ``derive_interval_s`` > 0, receipts left queued. None if the worker
    cannot run. Each part reconnects with back-off when the database goes away and reports
    its state in ``health`` (``/readyz``)."""
    from orchestrator.cli.worker import run_worker
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.errors import EngramError, is_unavailable
    from orchestrator.worker.embedder import Embedder
    from orchestrator.worker.queue import QueueWorker

    db = Database(settings)
    component = health.component("embedding worker")
    try:
        engine = make_app_engine(db.role_url("engram_worker"), pool_size=2)
        worker = QueueWorker(engine, Embedder.from_settings(settings), settings,
                             loader=lambda model: Embedder.for_model(settings, model))
        worker.follow_model()
    except Exception as exc:
        if not is_unavailable(exc):
            if not isinstance(exc, EngramError):
                raise
            # The API still answers without it; chunks wait in the queue until a worker runs.
            component.dead(exc)
            out.print(styled("worker not started:", "yellow", f" {exc}"))
            return None
        # The database is not reachable yet: the worker's loop waits for it with back-off.
    stop = threading.Event()

    def run() -> None:
        try:
            run_worker(db, engine, worker, settings, stop, health,
                       derive=settings.derive_interval_s > 0, extract=True, say=out.print)
        except Exception as exc:  # the component says it is dead; the API keeps answering
            component.dead(exc)
            log.error("the embedding worker stopped: %s", exc)
        finally:
            engine.dispose()

    thread = threading.Thread(target=run, name="engram-worker", daemon=True)
    thread.start()
    out.print("embedding worker running in this process"
              + ("" if settings.derive_interval_s > 0 else
                 " (derive jobs off: ENGRAM_DERIVE_INTERVAL_S is 0)"))
    return thread, stop


def serve_engram(settings: Settings) -> None:
    """Worker in a thread, API in the foreground, until interrupted."""
    production_gate(settings)
    from orchestrator.cli.logs import configure_logging

    configure_logging(settings)
    health = Health()
    started = start_worker(settings, health)
    try:
        serve_api(settings, health=health)
    finally:
        if started is not None:
            started[1].set()
            started[0].join(timeout=10)


def serve(
    host: Annotated[str | None, typer.Option(help="address to listen on")] = None,
    port: Annotated[int | None, typer.Option(help="port to listen on")] = None,
    write_schema: Annotated[bool, typer.Option(
        "--write-schema", help="write graphql/schema.printed.graphql and exit")] = False,
) -> None:
    """Serve the GraphQL API (POST /graphql; GraphiQL on GET in development)."""
    if write_schema:
        from orchestrator.api.schema import PRINTED_SCHEMA, printed_schema

        PRINTED_SCHEMA.write_text(printed_schema())
        out.print(f"wrote {PRINTED_SCHEMA}")
        return
    settings = load_settings()
    production_gate(settings)
    serve_api(settings, host, port)


def mcp(
    token: Annotated[str | None, typer.Option(envvar="ENGRAM_TOKEN", help="bearer token (stdio)")] = None,
    http: Annotated[bool, typer.Option("--http", help="streamable HTTP; bearer token per request")] = False,
    host: Annotated[str | None, typer.Option(help="address for --http")] = None,
    port: Annotated[int, typer.Option(help="port for --http")] = 8701,
) -> None:
    """Serve Engram's MCP tools: stdio for the identity of ENGRAM_TOKEN, or --http.

    The models load and every recall stage warms in the background as it starts ("MCP
    ready" on stderr)."""
    from orchestrator.api.mcp import http_server, stdio_server
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.errors import EngramError

    settings = load_settings()
    if http:
        production_gate(settings)
        engine = make_app_engine(Database(settings).app_url())
        host = host or settings.api_host
        try:
            http_server(settings, engine, host, port).run("streamable-http", host=host, port=port)
        finally:
            engine.dispose()
        return
    if not token:
        typer.echo("error: set ENGRAM_TOKEN (or --token) to the agent's bearer token", err=True)
        raise typer.Exit(2)
    engine = make_app_engine(Database(settings).app_url(), pool_size=2)
    try:
        try:
            server = stdio_server(settings, engine, token)
        except EngramError as exc:
            typer.echo(f"error: {exc} ({exc.code})", err=True)
            raise typer.Exit(2) from exc
        server.run("stdio")
    finally:
        engine.dispose()
