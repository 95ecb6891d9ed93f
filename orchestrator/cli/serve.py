"""``engram serve``: the GraphQL API under uvicorn.

The app connects only as ``engram_app``; ``engram up`` calls ``serve_api`` after
migrating so that ``make up`` ends with Engram answering requests.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from orchestrator.config import Settings

out = Console(highlight=False, soft_wrap=True)


def serve_api(settings: Settings, host: str | None = None, port: int | None = None) -> None:
    import uvicorn

    from orchestrator.api.app import create_app
    from orchestrator.db.engine import Database, make_app_engine

    engine = make_app_engine(Database(settings).app_url())
    app = create_app(settings, engine)
    host = host or settings.api_host
    port = port or settings.api_port
    out.print(f"GraphQL API on http://{host}:{port}/graphql")
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", lifespan="off")
    finally:
        engine.dispose()


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
