"""``engram recall``, ``engram prepare`` and ``engram trace``: recall for people, the
bundle for prompts, and the view to debug them.

Both take the identity the way every CLI command does: a bearer token
(``--token`` or ``ENGRAM_TOKEN``), or a token minted with the local development
key for ``--org``/``--user`` with ``--read``/``--write`` scope lists. The
identity is verified before anything runs; scopes are never passed to recall
directly.

**Where the answer comes from.** When an API server answers at ``ENGRAM_API_URL``
(default ``http://<api_host>:<api_port>``, what ``engram serve``/``engram up`` listen
on), the command asks it over GraphQL with the caller's token: the server's models are
loaded and its plans prepared, so nothing heavy happens here. Otherwise (or with
``--local``) it recalls in this process: the embedding comes from the served worker
when ``ENGRAM_WORKER_URL`` is set, else the model loads here (seconds). A line on
stderr says which path answered.
"""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import typer

from orchestrator.cli.output import console, exit_status, styled
from orchestrator.config import Settings
from orchestrator.errors import EngramError, Unauthenticated
from orchestrator.messages import nothing_served, shown

out = console()
err = console(stderr=True)

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
Local = Annotated[bool, typer.Option("--local", help="recall in this process even when an API "
                                                     "server is running")]

_ARGS = ("$q: String!, $asker: String, $budget: Int, $mode: String, $session: String")
_CALL = "(question: $q, asker: $asker, budgetTokens: $budget, mode: $mode, sessionId: $session)"
_FIELDS = "rendered budgetTokens neededTokens receiptId"
QUERIES = {
    "recall": f"query({_ARGS}) {{ answer: recall{_CALL} {{ {_FIELDS} }} }}",
    "prepare": f"query({_ARGS}) {{ answer: memoryPrepare{_CALL} {{ {_FIELDS} }} }}",
    "trace": f"query({_ARGS}) {{ answer: recallTrace{_CALL} {{ {_FIELDS} text }} }}",
}


def _fail(message: str, status: int = 1) -> NoReturn:
    err.print(styled("error:", "red", f" {message}"))
    raise typer.Exit(status)


def api_url(settings: Settings) -> str:
    """Where the CLI looks for a running API server."""
    if settings.api_url:
        return settings.api_url.rstrip("/")
    host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::", "") else settings.api_host  # noqa: S104
    return f"http://{host}:{settings.api_port}"


def _server_answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def _over_api(url: str, token: str, what: str, variables: dict[str, Any]) -> dict[str, Any] | None:
    """The server's answer; None when the server stopped answering (the caller falls back)."""
    import httpx

    from orchestrator.auth.tokens import well_formed

    try:
        # Refused here as the server would refuse it: httpx cannot even encode a header of an
        # error message stored in ENGRAM_TOKEN (a traceback), and a token that is no JWT
        # would only make the round trip.
        well_formed(token)
    except Unauthenticated as exc:
        _fail(str(exc), exit_status(exc))
    try:
        response = httpx.post(f"{url}/graphql", json={"query": QUERIES[what], "variables": variables},
                              headers={"authorization": f"Bearer {token}"}, timeout=120)
    except httpx.HTTPError:
        return None
    try:
        body = response.json()
    except ValueError:
        _fail(f"the API at {url} answered HTTP {response.status_code} without JSON")
    if body.get("errors"):
        first = body["errors"][0]
        code = (first.get("extensions") or {}).get("code")
        message = str(first.get("message"))
        if code == "UNAUTHENTICATED":
            from orchestrator.cli.auth import token_hint

            message = token_hint(message)
        _fail(message + (f" ({code})" if code else ""), exit_status(code))
    answer: dict[str, Any] = body["data"]["answer"]
    return answer


def _run(question: str, token: str | None, org: str | None, user: str, read: str, write: str,
         asker: str | None, budget: int | None, mode: str | None, what: str,
         session: str | None = None, local: bool = False) -> None:
    from orchestrator.cli.auth import parse_scopes

    settings = Settings()
    scopes = [f"read:{s}" for s in parse_scopes(read)] + [f"write:{s}" for s in parse_scopes(write)]
    url = api_url(settings)
    if not local and _server_answers(url):
        try:
            if not token:
                if not org:
                    raise EngramError(
                        "no identity: pass --token (or set ENGRAM_TOKEN), or --org and --read/"
                        "--write to mint one with the development key")
                from orchestrator.auth.devkey import mint_token

                token = mint_token(settings, tenant=org, user=user, scopes=scopes, ttl_s=900)
        except EngramError as exc:
            _fail(str(exc))
        answer = _over_api(url, token, what, {"q": question, "asker": asker, "budget": budget,
                                              "mode": mode, "session": session})
        if answer is not None:
            err.print(f"answered by the API at {url} (its models and plans; nothing loaded here)")
            _show(what, answer.get("text"), answer["rendered"],
                  nothing_served(answer.get("neededTokens"), answer.get("budgetTokens")),
                  answer.get("receiptId"))
            return
        err.print(f"the API at {url} stopped answering; recalling in this process", style="yellow")
    _in_process(settings, question, token, org, user, " ".join(scopes), asker, budget, mode, what,
                session, url, local)


def _in_process(settings: Settings, question: str, token: str | None, org: str | None, user: str,
                scopes: str, asker: str | None, budget: int | None, mode: str | None, what: str,
                session: str | None, url: str, local: bool) -> None:
    from orchestrator.cli.auth import cli_identity
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.recall import Recaller

    why = "--local" if local else f"no API server answers at {url}"
    models = (f"embeddings from the worker at {settings.worker_url}" if settings.worker_url
              else "the embedding model loads here")
    err.print(f"answered in this process ({why}; {models})")
    try:
        identity = cli_identity(settings, token=token, tenant=org, user=user, scopes=scopes)
        engine = make_app_engine(Database(settings).app_url(), pool_size=1)
        try:
            recaller = Recaller(engine, settings)
            if what == "prepare":
                bundle, trace = recaller.prepare(identity, question, asker, budget, mode, session,
                                                 "cli")
                rendered, receipt = bundle.rendered, bundle.receipt_id
            else:
                result, trace = recaller.trace(identity, question, asker, budget, mode, session, "cli")
                rendered, receipt = result.rendered, result.receipt_id
            why = nothing_served(trace.needed_tokens, trace.budget_tokens)
            recaller.settle()  # the receipt's chain event, before this process ends
        finally:
            engine.dispose()
    except EngramError as exc:
        _fail(str(exc), exit_status(exc))
    _show(what, trace.format(), rendered, why, None if receipt is None else str(receipt))


def _show(what: str, trace: str | None, rendered: str, why: str, receipt: str | None) -> None:
    """The answer on stdout; a recall's or bundle's receipt on stderr, with how to check the
    printed text (a trace names its receipt among its side effects)."""
    if receipt and what != "trace":
        err.print(f"receipt {receipt} (`engram audit receipt {receipt} --rendered FILE` proves "
                  "a saved copy of this answer)")
    out.print(shown(trace if what == "trace" else None, rendered, why))


def recall_command(question: Annotated[str, typer.Argument(help="the question")],
                   token: Token = None, org: Org = None, user: User = "dev", read: Read = "",
                   write: Write = "", asker: Asker = None, budget: Budget = None,
                   mode: Mode = None, session: SessionOpt = None, local: Local = False) -> None:
    """Recall evidence for QUESTION and print the prompt-ready string."""
    _run(question, token, org, user, read, write, asker, budget, mode, "recall", session, local)


def prepare_command(question: Annotated[str, typer.Argument(help="the question")],
                    token: Token = None, org: Org = None, user: User = "dev", read: Read = "",
                    write: Write = "", asker: Asker = None, budget: Budget = None,
                    mode: Mode = None, session: SessionOpt = None, local: Local = False) -> None:
    """memory_prepare: keyed facts, evidence, lessons, episodes and documents under one budget."""
    _run(question, token, org, user, read, write, asker, budget, mode, "prepare", session, local)


def trace_command(question: Annotated[str, typer.Argument(help="the question")],
                  token: Token = None, org: Org = None, user: User = "dev", read: Read = "",
                  write: Write = "", asker: Asker = None, budget: Budget = None,
                  mode: Mode = None, session: SessionOpt = None, local: Local = False) -> None:
    """Show every stage of a recall: pools per lane, fusion, rerank, budget cut, timings."""
    _run(question, token, org, user, read, write, asker, budget, mode, "trace", session, local)

