"""MCP tools (the official ``mcp`` SDK) over the in-process client.

Two transports, one set of tools:

* ``engram mcp`` serves them on stdio for one agent. Its identity is the token
  in ``ENGRAM_TOKEN``, verified at start exactly like a bearer token; a token
  that does not verify stops the server before it answers anything;
* ``engram mcp --http`` serves streamable HTTP; every request carries its own
  bearer token, which the SDK's bearer middleware hands to ``BearerVerifier``
  (Engram's verifier): no token or a bad one is a 401 before any tool runs,
  and each tool call acts as the identity of the request's token.

Every tool call is one transaction under that identity (``orchestrator.client``),
so the scope lattice and row level security apply as they do over GraphQL; a
refusal comes back as a tool error carrying Engram's error code.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as SdkToolError
from pydantic import AnyHttpUrl
from sqlalchemy import Engine

from orchestrator.auth.tokens import TokenVerifier, identity_from_claims
from orchestrator.client import Engram
from orchestrator.config import Settings
from orchestrator.errors import EngramError
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest import memory as mem
from orchestrator.recall import Recaller


class ToolError(SdkToolError):
    """What an MCP client sees: the code and message of an Engram error (the SDK shows only
    its own ToolError's text; any other exception reaches the client as a bare failure)."""


def _call(fn: Any, *args: Any, **kw: Any) -> Any:
    try:
        return fn(*args, **kw)
    except EngramError as exc:
        raise ToolError(f"{exc.code}: {exc.message}") from exc


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


def http_server(settings: Settings, engine: Engine, host: str, port: int) -> MCPServer[Any]:
    """Streamable HTTP: each tool call acts as the identity of its request's bearer token."""
    verifier = TokenVerifier.from_settings(settings)
    recaller = Recaller(engine, settings)

    def engram_for() -> Engram:
        access = get_access_token()
        if access is None:  # the bearer middleware lets no such request through
            raise ToolError("UNAUTHENTICATED: no bearer token")
        client: Engram = _call(Engram, engine, access.token, settings, verifier=verifier,
                               recaller=recaller)
        return client

    issuer = settings.auth_issuer or f"http://{host}:{port}/{settings.auth_dev_issuer}"
    auth = AuthSettings(issuer_url=AnyHttpUrl(issuer),
                        resource_server_url=AnyHttpUrl(f"http://{host}:{port}/mcp"))
    return build_server(engram_for, auth=auth, token_verifier=BearerVerifier(verifier))


def build_server(engram_for: Callable[[], Engram], *, auth: AuthSettings | None = None,
                 token_verifier: BearerVerifier | None = None) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(
        name="engram", instructions="Engram memory: recall evidence, remember, record facts.",
        auth=auth, token_verifier=token_verifier)

    @server.tool()
    def recall(question: str, asker: str | None = None, budget_tokens: int | None = None
               ) -> dict[str, Any]:
        """Evidence for a question from everything this identity may read, within a token budget."""
        result = _call(engram_for().recall, question, asker=asker, budget_tokens=budget_tokens)
        return {"rendered": result.rendered, "used_tokens": result.used_tokens,
                "evidence": [{"text": e.text, "provenance": str(e.provenance), "kind": e.kind,
                              "item_table": e.item_table,
                              "item_id": str(e.item_id) if e.item_id else None,
                              "scopes": [s.name for s in e.scopes],
                              "source": f"{e.source.collection}/{e.source.path}" if e.source else None}
                             for e in result.evidence]}

    @server.tool()
    def memory_prepare(question: str, asker: str | None = None, budget_tokens: int | None = None
                       ) -> str:
        """One prompt-ready bundle under one budget: current keyed facts about the entities in
        play, relevant evidence, lessons, recent episodes and top documents."""
        return str(_call(engram_for().memory_prepare, question, asker=asker,
                         budget_tokens=budget_tokens).rendered)

    @server.tool()
    def remember(session_id: str, text: str, scopes: list[str], ttl_seconds: int = 86400) -> str:
        """Keep a recent session item; returns its id."""
        if ttl_seconds <= 0:
            raise ToolError("BAD_USER_INPUT: ttl_seconds must be positive")
        with engram_for().session() as s:
            return str(_call(mem.add_working_memory, s, session_id, text, scopes,
                             ttl=timedelta(seconds=ttl_seconds)))

    @server.tool()
    def assert_fact(subject_id: str, predicate: str, text: str, scopes: list[str],
                    value: str | float | bool | None = None, object_id: str | None = None,
                    kind: str = "world_fact", confidence: float = 1.0) -> dict[str, Any]:
        """Assert a claim about an entity; it lands or is quarantined with the reasons."""
        with engram_for().session() as s:
            result = _call(kn.assert_fact, s, kn.FactInput(
                subject_id=_id(subject_id), predicate=predicate, text=text, scopes=tuple(scopes),
                value=value, object_id=_id(object_id) if object_id else None,
                kind=kind, confidence=confidence))  # type: ignore[arg-type]
        return {"claim_id": str(result.claim_id) if result.claim_id else None,
                "quarantined": result.quarantined, "reasons": list(result.reasons)}

    @server.tool()
    def record_decision(category: str, scenario: str, reasoning: str, confidence: float,
                        scopes: list[str], outcome: str | None = None) -> str:
        """Record a decision with its reasoning; returns its id."""
        with engram_for().session() as s:
            return str(_call(mem.record_decision, s, mem.DecisionInput(
                category, scenario, reasoning, confidence, tuple(scopes), outcome)))

    @server.tool()
    def search_documents(collection: str | None = None, kind: str | None = None,
                         state: str | None = None, first: int = 20, after: str | None = None
                         ) -> dict[str, Any]:
        """Readable documents (no bodies), ordered by collection and path, with a next cursor."""
        page = _call(engram_for().documents, first=first, after=after, collection=collection, kind=kind,
                     state=state)
        return {"documents": [{"id": str(v.id), "collection": v.collection, "path": v.path,
                               "title": v.title, "kind": v.kind, "state": v.state}
                              for _, v in page.items],
                "next": page.end_cursor if page.has_next_page else None}

    @server.tool()
    def get_document(collection: str, path: str) -> dict[str, Any] | None:
        """One readable document with its body, or null."""
        view = _call(engram_for().document, collection, path)
        if view is None:
            return None
        return {"id": str(view.id), "title": view.title, "body": view.body, "kind": view.kind,
                "state": view.state, "scopes": [s.name for s in view.scopes],
                "updated_at": view.updated_at.isoformat()}

    @server.tool()
    def mark_used(items: list[dict[str, str]] | None = None, claim_ids: list[str] | None = None) -> int:
        """Feedback: these served items helped. items: [{"table": item_table, "id": item_id}] from
        recall's evidence; claim_ids: the short form for facts. Returns how many were recorded."""
        from orchestrator.derive.lifecycle import mark_evidence_used

        used = [(str(i.get("table")), _id(str(i.get("id")))) for i in items or []]
        used += [("knowledge.fact_claim", _id(c)) for c in claim_ids or []]
        if not used:
            raise ToolError("BAD_USER_INPUT: give the items (or claim_ids) that were used")
        with engram_for().session() as s:
            return int(_call(mark_evidence_used, s, used, channel="mcp"))

    return server


def _id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise ToolError(f"BAD_USER_INPUT: {value!r} is not a UUID") from exc
