"""MCP tools (the official ``mcp`` SDK) over the in-process client.

``engram mcp`` serves these tools on stdio for one agent. Its identity is the
token in ``ENGRAM_TOKEN``, verified at start exactly like a bearer token; a
token that does not verify stops the server before it answers anything. Every
tool call is one transaction under that identity (``orchestrator.client``), so
the scope lattice and row level security apply as they do over GraphQL; a
refusal comes back as a tool error carrying Engram's error code.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as SdkToolError

from orchestrator.client import Engram
from orchestrator.errors import EngramError
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest import memory as mem


class ToolError(SdkToolError):
    """What an MCP client sees: the code and message of an Engram error (the SDK shows only
    its own ToolError's text; any other exception reaches the client as a bare failure)."""


def _call(fn: Any, *args: Any, **kw: Any) -> Any:
    try:
        return fn(*args, **kw)
    except EngramError as exc:
        raise ToolError(f"{exc.code}: {exc.message}") from exc


def build_server(engram: Engram) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(
        name="engram", instructions="Engram memory: recall evidence, remember, record facts.")

    @server.tool()
    def recall(question: str, asker: str | None = None, budget_tokens: int | None = None
               ) -> dict[str, Any]:
        """Evidence for a question from everything this identity may read, within a token budget."""
        result = _call(engram.recall, question, asker=asker, budget_tokens=budget_tokens)
        return {"rendered": result.rendered, "used_tokens": result.used_tokens,
                "evidence": [{"text": e.text, "provenance": str(e.provenance),
                              "scopes": [s.name for s in e.scopes],
                              "source": f"{e.source.collection}/{e.source.path}" if e.source else None}
                             for e in result.evidence]}

    @server.tool()
    def memory_prepare(question: str, asker: str | None = None, budget_tokens: int | None = None
                       ) -> str:
        """One prompt-ready string of the evidence for a question."""
        return str(_call(engram.recall, question, asker=asker, budget_tokens=budget_tokens).rendered)

    @server.tool()
    def remember(session_id: str, text: str, scopes: list[str], ttl_seconds: int = 86400) -> str:
        """Keep a recent session item; returns its id."""
        if ttl_seconds <= 0:
            raise ToolError("BAD_USER_INPUT: ttl_seconds must be positive")
        with engram.session() as s:
            return str(_call(mem.add_working_memory, s, session_id, text, scopes,
                             ttl=timedelta(seconds=ttl_seconds)))

    @server.tool()
    def assert_fact(subject_id: str, predicate: str, text: str, scopes: list[str],
                    value: str | float | bool | None = None, object_id: str | None = None,
                    kind: str = "world_fact", confidence: float = 1.0) -> dict[str, Any]:
        """Assert a claim about an entity; it lands or is quarantined with the reasons."""
        with engram.session() as s:
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
        with engram.session() as s:
            return str(_call(mem.record_decision, s, mem.DecisionInput(
                category, scenario, reasoning, confidence, tuple(scopes), outcome)))

    @server.tool()
    def search_documents(collection: str | None = None, kind: str | None = None,
                         state: str | None = None, first: int = 20, after: str | None = None
                         ) -> dict[str, Any]:
        """Readable documents (no bodies), ordered by collection and path, with a next cursor."""
        page = _call(engram.documents, first=first, after=after, collection=collection, kind=kind,
                     state=state)
        return {"documents": [{"id": str(v.id), "collection": v.collection, "path": v.path,
                               "title": v.title, "kind": v.kind, "state": v.state}
                              for _, v in page.items],
                "next": page.end_cursor if page.has_next_page else None}

    @server.tool()
    def get_document(collection: str, path: str) -> dict[str, Any] | None:
        """One readable document with its body, or null."""
        view = _call(engram.document, collection, path)
        if view is None:
            return None
        return {"id": str(view.id), "title": view.title, "body": view.body, "kind": view.kind,
                "state": view.state, "scopes": [s.name for s in view.scopes],
                "updated_at": view.updated_at.isoformat()}

    @server.tool()
    def mark_used(claim_ids: list[str]) -> int:
        """Feedback: these recalled facts were used."""
        with engram.session() as s:
            return int(_call(kn.touch_facts, s, [_id(c) for c in claim_ids]))

    return server


def _id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise ToolError(f"BAD_USER_INPUT: {value!r} is not a UUID") from exc
