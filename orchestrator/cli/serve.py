"""``engram serve``: the GraphQL API under uvicorn.

The app connects only as ``engram_app``; ``engram up`` calls ``serve_engram``
after migrating, so that ``make up`` ends with Engram running: the embedding
worker in a thread of the same process (as ``engram_worker``) and the API in
the foreground.
"""

from __future__ import annotations

import threading
from typing import Annotated

import typer
from rich.console import Console

from orchestrator.config import Settings

out = Console(highlight=False, soft_wrap=True)


def serve_api(settings: Settings, host: str | None = None, port: int | None = None) -> None:
    import uvicorn

    from orchestrator.api.app import create_app
    from orchestrator.db.engine import Database, make_app_engine

    engine = make_app_engine(Database(settings).app_url(), pool_size=settings.api_threads)
    app = create_app(settings, engine)
    host = host or settings.api_host
    port = port or settings.api_port
    out.print(f"GraphQL API on http://{host}:{port}/graphql")
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", lifespan="off")
    finally:
        engine.dispose()


def start_worker(settings: Settings) -> tuple[threading.Thread, threading.Event] | None:
    """The embedding worker in a thread of this process (``engram up``), and the derive jobs in
    another when ``derive_interval_s`` > 0; None if the worker cannot run."""
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.errors import EngramError
    from orchestrator.worker.embedder import Embedder
    from orchestrator.worker.queue import QueueWorker

    db = Database(settings)
    try:
        engine = make_app_engine(db.role_url("engram_worker"), pool_size=2)
        worker = QueueWorker(engine, Embedder.from_settings(settings), settings,
                             loader=lambda model: Embedder.for_model(settings, model))
        worker.follow_model()
    except EngramError as exc:
        # The API still answers without it; chunks wait in the queue until a worker runs.
        out.print(f"[yellow]worker not started:[/yellow] {exc}")
        return None
    stop = threading.Event()
    scheduler = None
    if settings.derive_interval_s > 0:
        from orchestrator.cli.worker import _derive_scheduler

        scheduler = _derive_scheduler(db, engine, settings, None, verbose=False)

    def run() -> None:
        try:
            worker.run_forever(db.psql_url("engram_worker"), stop)
        finally:
            engine.dispose()
            if scheduler is not None:
                scheduler.app_engine.dispose()

    thread = threading.Thread(target=run, name="engram-worker", daemon=True)
    thread.start()
    out.print("embedding worker running in this process")
    if scheduler is not None:
        threading.Thread(target=scheduler.run_forever, args=(stop,), name="engram-derive",
                         daemon=True).start()
        out.print(f"derive jobs every {settings.derive_interval_s:g}s for every tenant "
                  "(ENGRAM_DERIVE_INTERVAL_S; 0 turns them off)")
    return thread, stop


def serve_engram(settings: Settings) -> None:
    """Worker in a thread, API in the foreground, until interrupted."""
    started = start_worker(settings)
    try:
        serve_api(settings)
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
    serve_api(Settings(), host, port)


def mcp(
    token: Annotated[str | None, typer.Option(envvar="ENGRAM_TOKEN", help="bearer token (stdio)")] = None,
    http: Annotated[bool, typer.Option("--http", help="streamable HTTP; bearer token per request")] = False,
    host: Annotated[str | None, typer.Option(help="address for --http")] = None,
    port: Annotated[int, typer.Option(help="port for --http")] = 8701,
) -> None:
    """Serve Engram's MCP tools: stdio for the identity of ENGRAM_TOKEN, or --http."""
    from orchestrator.api.mcp import http_server, stdio_server
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.errors import EngramError

    settings = Settings()
    if http:
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
