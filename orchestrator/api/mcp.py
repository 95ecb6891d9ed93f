"""MCP tools (the official ``mcp`` SDK) over the in-process client.

Two transports, one set of tools:

* ``engram mcp`` serves them on stdio for one agent. Its identity is the token
  in ``ENGRAM_TOKEN``, verified at start exactly like a bearer token (a token
  that does not verify stops the server before it answers anything) and again
  at every tool call, so a token that expires (or whose key the issuer drops)
  while the agent runs is refused from then on, with a message saying so;
* ``engram mcp --http`` serves streamable HTTP; every request carries its own
  bearer token, which the SDK's bearer middleware hands to ``BearerVerifier``
  (Engram's verifier): no token or a bad one is a 401 before any tool runs,
  and each tool call acts as the identity of the request's token.

Every tool call is one transaction under that identity (``orchestrator.client``,
the same service functions as GraphQL), so the scope lattice and row level
security apply as they do over GraphQL. Any refusal, a database error at commit
included, comes back as a tool error whose text starts with Engram's error code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as SdkToolError
from pydantic import AnyHttpUrl
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from orchestrator.api.audit import AuditorEngine
from orchestrator.auth.tokens import TokenVerifier, identity_from_claims
from orchestrator.client import Engram
from orchestrator.config import Settings
from orchestrator.db.session import translate
from orchestrator.errors import EngramError, Unauthenticated, internal_message, is_public
from orchestrator.inputs import check_arguments
from orchestrator.recall import Evidence, Recaller

F = TypeVar("F", bound=Callable[..., Any])


class ToolError(SdkToolError):
    """What an MCP client sees: the code and message of an Engram error (the SDK shows only
    its own ToolError's text; any other exception reaches the client as a bare failure)."""


def tool_error(exc: EngramError) -> ToolError:
    return ToolError(f"{exc.code}: {exc.message if is_public(exc) else internal_message(exc, 'a tool call')}")


def coded(fn: F) -> F:
    """Run a tool so that its arguments are checked like every input (no NUL or lone surrogate,
    finite numbers, 32-bit ints, bounded nesting) and every Engram or database error, at commit
    too, is a coded ToolError."""

    @functools.wraps(fn)
    def run(*args: Any, **kw: Any) -> Any:
        try:
            # The rules every entry point applies (orchestrator.inputs), by argument name.
            check_arguments({**{f"argument {n}": a for n, a in enumerate(args)}, **kw})
            return fn(*args, **kw)
        except EngramError as exc:
            raise tool_error(exc) from exc
        except DBAPIError as exc:
            raise tool_error(translate(exc)) from exc

    return run  # type: ignore[return-value]


class BearerVerifier:
    """The SDK's token-verifier protocol over Engram's ``TokenVerifier``."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self.verifier = verifier

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            claims = await anyio.to_thread.run_sync(self.verifier.claims, token)
            identity = identity_from_claims(claims)
        except EngramError:
            return None
        return AccessToken(token=token, client_id=identity.user_id, subject=identity.user_id,
                           scopes=sorted(claims.get("scope", "").split())
                           if isinstance(claims.get("scope"), str) else [],
                           expires_at=int(claims["exp"]), resource=None)


def stdio_server(settings: Settings, engine: Engine, token: str) -> MCPServer[Any]:
    """stdio: every tool call verifies ``token`` again (expiry included) before it acts.

    The token is checked once here too, so a bad one stops ``engram mcp`` at start."""
    verifier = TokenVerifier.from_settings(settings)
    verifier.verify(token)
    recaller = Recaller(engine, settings)
    auditor = AuditorEngine(settings)

    def engram_for() -> Engram:
        try:
            return Engram(engine, token, settings, verifier=verifier, recaller=recaller,
                          auditor=auditor, channel="mcp")
        except Unauthenticated as exc:
            raise Unauthenticated(f"ENGRAM_TOKEN no longer verifies ({exc.message}); restart "
                                  "`engram mcp` with a fresh token") from exc

    return build_server(engram_for)


def http_server(settings: Settings, engine: Engine, host: str, port: int) -> MCPServer[Any]:
    """Streamable HTTP: each tool call acts as the identity of its request's bearer token."""
    verifier = TokenVerifier.from_settings(settings)
    recaller = Recaller(engine, settings)
    auditor = AuditorEngine(settings)

    def engram_for() -> Engram:
        access = get_access_token()
        if access is None:  # the bearer middleware lets no such request through
            raise Unauthenticated("no bearer token")
        return Engram(engine, access.token, settings, verifier=verifier, recaller=recaller,
                      auditor=auditor, channel="mcp")

    issuer = settings.auth_issuer or f"http://{host}:{port}/{settings.auth_dev_issuer}"
    auth = AuthSettings(issuer_url=AnyHttpUrl(issuer),
                        resource_server_url=AnyHttpUrl(f"http://{host}:{port}/mcp"))
    return build_server(engram_for, auth=auth, token_verifier=BearerVerifier(verifier))


def _evidence(e: Evidence) -> dict[str, Any]:
    return {"text": e.text, "provenance": str(e.provenance), "kind": e.kind,
            "item_table": e.item_table, "item_id": str(e.item_id) if e.item_id else None,
            "scopes": [s.name for s in e.scopes],
            "source": f"{e.source.collection}/{e.source.path}" if e.source else None}


def build_server(engram_for: Callable[[], Engram], *, auth: AuthSettings | None = None,
                 token_verifier: BearerVerifier | None = None) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(
        name="engram", instructions="Engram memory: recall evidence, remember, record facts.",
        auth=auth, token_verifier=token_verifier)

    @server.tool()
    @coded
    def recall(question: str, asker: str | None = None, budget_tokens: int | None = None,
               mode: str | None = None, session_id: str | None = None) -> dict[str, Any]:
        """Evidence for a question from everything this identity may read, within a token budget.
        mode (causal, timeline) adds weight to those lanes; session_id limits the session notes
        to the asker's current session."""
        result = engram_for().recall(question, asker=asker, budget_tokens=budget_tokens, mode=mode,
                                     session=session_id)
        return {"rendered": result.rendered, "used_tokens": result.used_tokens,
                "evidence": [_evidence(e) for e in result.evidence]}

    @server.tool()
    @coded
    def memory_prepare(question: str, asker: str | None = None, budget_tokens: int | None = None,
                       session_id: str | None = None) -> str:
        """One prompt-ready bundle under one budget: current keyed facts about the entities in
        play, relevant evidence, lessons, recent episodes and top documents."""
        return str(engram_for().memory_prepare(question, asker=asker, budget_tokens=budget_tokens,
                                               session=session_id).rendered)

    @server.tool()
    @coded
    def remember(session_id: str, text: str, scopes: list[str], ttl_seconds: int = 86400) -> str:
        """Keep a recent session item; returns its id."""
        return str(engram_for().remember(session_id, text, scopes, ttl_seconds=ttl_seconds))

    @server.tool()
    @coded
    def assert_fact(subject_id: str, predicate: str, text: str, scopes: list[str],
                    value: str | float | bool | None = None, object_id: str | None = None,
                    datatype: str | None = None, kind: str = "world_fact",
                    confidence: float = 1.0, authority: int = 0, valid_from: str | None = None,
                    valid_to: str | None = None, fact_key: str | None = None,
                    as_of: str | None = None) -> dict[str, Any]:
        """Assert a claim about an entity; it lands or is quarantined with the reasons. A keyed
        fact gives fact_key and as_of (ISO 8601 with a time zone): the newest as_of per key is
        current and outranks prose that contradicts it."""
        result = engram_for().assert_fact(
            subject_id, predicate, text, scopes, value=value, object_id=object_id,
            datatype=datatype, kind=kind, confidence=confidence,  # type: ignore[arg-type]
            authority=authority, valid_from=valid_from, valid_to=valid_to, fact_key=fact_key,
            as_of=as_of)
        return {"claim_id": str(result.claim_id) if result.claim_id else None,
                "quarantine_id": str(result.quarantine_id) if result.quarantine_id else None,
                "quarantined": result.quarantined, "reasons": list(result.reasons)}

    @server.tool()
    @coded
    def record_decision(category: str, scenario: str, reasoning: str, confidence: float,
                        scopes: list[str], outcome: str | None = None) -> str:
        """Record a decision with its reasoning; returns its id."""
        return str(engram_for().record_decision(category, scenario, reasoning, confidence, scopes,
                                                outcome=outcome))

    @server.tool()
    @coded
    def search_documents(collection: str | None = None, kind: str | None = None,
                         state: str | None = None, first: int = 20, after: str | None = None
                         ) -> dict[str, Any]:
        """Readable documents (no bodies), ordered by collection and path, with a next cursor."""
        page = engram_for().documents(first=first, after=after, collection=collection, kind=kind,
                                      state=state)
        return {"documents": [{"id": str(v.id), "collection": v.collection, "path": v.path,
                               "title": v.title, "kind": v.kind, "state": v.state}
                              for _, v in page.items],
                "next": page.end_cursor if page.has_next_page else None}

    @server.tool()
    @coded
    def get_document(collection: str, path: str) -> dict[str, Any] | None:
        """One readable document with its body, or null."""
        view = engram_for().document(collection, path)
        if view is None:
            return None
        return {"id": str(view.id), "title": view.title, "body": view.body, "kind": view.kind,
                "state": view.state, "scopes": [s.name for s in view.scopes],
                "updated_at": view.updated_at.isoformat()}

    @server.tool()
    @coded
    def mark_used(items: list[dict[str, str]] | None = None, claim_ids: list[str] | None = None) -> int:
        """Feedback: these served items helped. items: [{"table": item_table, "id": item_id}] from
        recall's evidence; claim_ids: the short form for facts. Returns how many were recorded."""
        return engram_for().mark_used([(str(i.get("table")), str(i.get("id"))) for i in items or []],
                                      claim_ids=claim_ids or [])

    return server
