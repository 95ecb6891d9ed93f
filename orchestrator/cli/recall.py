"""``engram recall``, ``engram prepare`` and ``engram trace``: recall for people, the
bundle for prompts, and the view to debug them.

Both take the identity the way every CLI command does: a bearer token
(``--token`` or ``ENGRAM_TOKEN``), or a token minted with the local development
key for ``--org``/``--user`` with ``--read``/``--write`` scope lists. The
identity is verified before anything runs; scopes are never passed to recall
directly.
"""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from rich.console import Console

from orchestrator.config import Settings
from orchestrator.errors import EngramError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

Token = Annotated[str | None, typer.Option(envvar="ENGRAM_TOKEN", help="bearer token")]
Org = Annotated[str | None, typer.Option("--org", "--tenant",
                                         help="mint a dev-key token for this organization")]
User = Annotated[str, typer.Option("--user", "--as", help="user of a minted token (who asks)")]
Read = Annotated[str, typer.Option(help="read scopes of a minted token, e.g. a,b")]
Write = Annotated[str, typer.Option(help="write scopes of a minted token, e.g. c")]
Asker = Annotated[str | None, typer.Option(help="who asks (enriches the query embedding)")]
Budget = Annotated[int | None, typer.Option(help="token budget (default from settings)")]
Mode = Annotated[str | None, typer.Option(help="causal or timeline: adds weight, never removes")]
SessionOpt = Annotated[str | None, typer.Option("--session",
                                                help="the asker's working-memory session only")]


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(1)


def _run(question: str, token: str | None, org: str | None, user: str, read: str, write: str,
         asker: str | None, budget: int | None, mode: str | None, show_trace: bool,
         prepare: bool = False, session: str | None = None) -> None:
    from orchestrator.cli.auth import cli_identity, parse_scopes
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.recall import Recaller

    settings = Settings()
    scopes = " ".join([f"read:{s}" for s in parse_scopes(read)] +
                      [f"write:{s}" for s in parse_scopes(write)])
    try:
        identity = cli_identity(settings, token=token, tenant=org, user=user, scopes=scopes)
        engine = make_app_engine(Database(settings).app_url(), pool_size=1)
        try:
            recaller = Recaller(engine, settings)
            result, trace = (recaller.prepare if prepare else recaller.trace)(
                identity, question, asker, budget, mode, session)
        finally:
            engine.dispose()
    except EngramError as exc:
        _fail(str(exc))
    from orchestrator.recall.trace import NOTHING_FITS, report

    out.print(report(trace, result.rendered) if show_trace else result.rendered or NOTHING_FITS)


def recall_command(question: Annotated[str, typer.Argument(help="the question")],
                   token: Token = None, org: Org = None, user: User = "dev", read: Read = "",
                   write: Write = "", asker: Asker = None, budget: Budget = None,
                   mode: Mode = None, session: SessionOpt = None) -> None:
    """Recall evidence for QUESTION and print the prompt-ready string."""
    _run(question, token, org, user, read, write, asker, budget, mode, show_trace=False,
         session=session)


def prepare_command(question: Annotated[str, typer.Argument(help="the question")],
                    token: Token = None, org: Org = None, user: User = "dev", read: Read = "",
                    write: Write = "", asker: Asker = None, budget: Budget = None,
                    mode: Mode = None, session: SessionOpt = None) -> None:
    """memory_prepare: keyed facts, evidence, lessons, episodes and documents under one budget."""
    _run(question, token, org, user, read, write, asker, budget, mode, show_trace=False,
         prepare=True, session=session)


def trace_command(question: Annotated[str, typer.Argument(help="the question")],
                  token: Token = None, org: Org = None, user: User = "dev", read: Read = "",
                  write: Write = "", asker: Asker = None, budget: Budget = None,
                  mode: Mode = None, session: SessionOpt = None) -> None:
    """Show every stage of a recall: pools per lane, fusion, rerank, budget cut, timings."""
    _run(question, token, org, user, read, write, asker, budget, mode, show_trace=True,
         session=session)


def register(app: typer.Typer) -> None:
    app.command("recall")(recall_command)
    app.command("prepare")(prepare_command)
    app.command("trace")(trace_command)
