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

The tools cover what an agent or an operator does: who is asking (whoami: the
identity and the tenant's scopes, the names every write takes); recall, memory_prepare and
trace; notes (remember, session_notes), decisions and episodes; documents
(search, get, upsert with occurred_at, delete, pin, snooze, archive); entities,
claims and keyed facts; conflicts and quarantine (list, resolve, release);
feedback (mark_used); and, for auditors (token scope ``engram:auditor``), receipts,
lineage and the chain.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError as SdkToolError
from pydantic import AnyHttpUrl, Field, ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from orchestrator.api.audit import AuditorEngine
from orchestrator.api.bundles import id_text
from orchestrator.api.documents import DocumentView
from orchestrator.api.health import Warmup
from orchestrator.auth.tokens import TokenVerifier, identity_from_claims
from orchestrator.client import Engram
from orchestrator.config import Settings
from orchestrator.db.session import translate
from orchestrator.errors import BadInput, EngramError, Unauthenticated, internal_message, is_public
from orchestrator.ingest.documents import KNOWN_STATES
from orchestrator.ingest.knowledge import (
    CONFLICT_STATUSES,
    DATATYPES,
    EPISTEMIC_KINDS,
    QUARANTINE_STATUSES,
    STRATEGIES,
    AssertResult,
)
from orchestrator.ingest.values import timestamp
from orchestrator.inputs import check_arguments
from orchestrator.recall import Evidence, Recaller
from orchestrator.recall.statement import MODES
from orchestrator.recall.trace import report

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("engram.mcp")


def _said(text: str) -> Any:
    """A parameter's description, which MCP clients (and the model behind an agent) read in the
    tool's input schema: what the value is, its form, and where to find a valid one."""
    return Field(description=text)


def _one_of(values: tuple[str, ...]) -> str:
    return ", ".join(values)


# Parameters that several tools share, described once.
Question = Annotated[str, _said("The question, in plain words, that the evidence should answer.")]
Asker = Annotated[str | None, _said(
    "Who is asking, as the memory names its authors (e.g. 'alice'); embedded with the question, "
    "and the ranker sees which items the asker wrote. Omitted: the question alone.")]
Budget = Annotated[int | None, _said(
    "The most tokens the evidence may take, up to ENGRAM_RECALL_MAX_BUDGET_TOKENS (64,000 "
    "unless configured); omitted: ENGRAM_RECALL_BUDGET_TOKENS (2,000 unless configured).")]
Mode = Annotated[str | None, _said(
    f"Extra weight for one kind of evidence: {_one_of(MODES)} (never removes any); omitted: none.")]
RecallSession = Annotated[str | None, _said(
    "The asker's current session id (as given to remember): its session notes are the ones "
    "recall reads; omitted: all of the caller's unexpired notes.")]
SessionId = Annotated[str, _said(
    "An id the agent chooses for its current conversation (any text up to 200 characters, e.g. a "
    "UUID); notes and episodes of one conversation share it.")]
WriteScopes = Annotated[list[str], _said(
    "Names of the scopes to share the new row into (at least one); the caller must be allowed to "
    "write each. `whoami` lists them.")]
Moment = Annotated[str, _said("An ISO 8601 date and time with a time zone, e.g. "
                              "2026-05-02T08:00:00+00:00.")]
OptionalMoment = Annotated[str | None, _said(
    "An ISO 8601 date and time with a time zone, e.g. 2026-05-02T08:00:00+00:00; omitted: none.")]
Collection = Annotated[str, _said("The document's collection (a folder-like name, e.g. 'notes').")]
DocPath = Annotated[str, _said("The document's path within its collection, e.g. 'deploy.md'.")]
DocumentId = Annotated[str, _said("A document id, as search_documents or get_document return it.")]
EntityType = Annotated[str, _said(
    "The entity's type, e.g. person, organization, place, group, product, event, work, law.")]
EntityName = Annotated[str, _said("The entity's name (or one of its aliases; case and spacing "
                                  "do not matter).")]
EntityId = Annotated[str, _said("An entity id, as entity, resolve_entity or search_entities "
                                "return it.")]
First = Annotated[int, _said("How many to return at most: 1 to ENGRAM_API_MAX_PAGE_SIZE (100 "
                             "unless configured).")]
After = Annotated[str | None, _said("The next cursor of the previous page; omitted: the first "
                                    "page.")]


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


class EngramServer(MCPServer[Any]):
    """The SDK's server, with one change: arguments that do not match a tool's input schema
    (a string where a number belongs, a required argument missing) are refused like every
    other bad input, ``BAD_USER_INPUT`` naming each argument and what it must be, instead of
    the SDK's pydantic report (its error type, the rejected value, a documentation link).
    ``warmup``: the models' load and warm-up the transport started (``warm_in_background``)."""

    warmup: Warmup | None = None

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except SdkToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            problems = sorted({f"argument {'.'.join(str(p) for p in e['loc']) or name}: "
                               f"{e['msg'][:1].lower()}{e['msg'][1:]}"
                               for e in exc.__cause__.errors(include_url=False)})
            raise ToolError(f"Error executing tool {name}: BAD_USER_INPUT: "
                            + "; ".join(problems)) from exc.__cause__


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


def warm_in_background(recaller: Recaller, verifier: TokenVerifier) -> Warmup:
    """Load the models and warm every stage of a recall in a thread, as ``engram serve`` does,
    while the agent's client connects: the first recall of a session cost 4.3 s (the model
    loaded in it) against 45 ms for the next ones. A tool call that comes first waits for the
    model's load (the embedder's cache is locked), not for a second one. Said in the log
    (stderr: stdout is the stdio transport's)."""

    def said(w: Warmup) -> None:
        if w.state == "loaded":
            log.info("MCP ready: models loaded and every recall stage warmed in %.1f s (%s)",
                     w.seconds or 0.0, w.detail)
        else:
            log.warning("MCP: the models did not load (%s); recalls load them on first use",
                        w.detail)

    warmup = Warmup()
    warmup.start(recaller, verifier, on_done=said)
    return warmup


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

    server = build_server(engram_for)
    server.warmup = warm_in_background(recaller, verifier)
    return server


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
    server = build_server(engram_for, auth=auth, token_verifier=BearerVerifier(verifier))
    server.warmup = warm_in_background(recaller, verifier)
    return server


def _evidence(e: Evidence) -> dict[str, Any]:
    """An evidence item for a tool: its text and handles, and what GraphQL's ``Evidence`` says
    of it that an agent reasons with (who wrote it, when it happened, what a fact claims)."""
    return {"text": e.text, "provenance": str(e.provenance), "kind": e.kind,
            "item_table": e.item_table, "item_id": id_text(e.item_id),
            "scopes": [s.name for s in e.scopes],
            "source": f"{e.source.collection}/{e.source.path}" if e.source else None,
            "section": e.source.section_titles if e.source else [],
            "author": e.author, "occurred_at": plain(e.occurred_at),
            "ended_at": plain(e.ended_at), "updated_at": plain(e.updated_at),
            "fact": plain(e.fact), "clipped": e.clipped}


def plain(value: Any) -> Any:
    """A service result as a tool's JSON: dataclasses as objects with their field names, ids
    and moments as text, bytes as hex."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def _document(view: DocumentView, *, body: bool = False) -> dict[str, Any]:
    """A document for a tool: no body unless asked, scope names, its embedding progress."""
    out = {"id": str(view.id), "collection": view.collection, "path": view.path,
           "title": view.title, "kind": view.kind, "state": view.state, "area": view.area,
           "scopes": [s.name for s in view.scopes], "pinned": view.pinned,
           "snoozed_until": plain(view.snoozed_until), "archived_at": plain(view.archived_at),
           "occurred_at": plain(view.occurred_at), "updated_at": view.updated_at.isoformat(),
           "embedding": plain(view.embedding)}
    if body:
        out["body"] = view.body
    return out


def _assert_result(result: AssertResult) -> dict[str, Any]:
    return {"claim_id": str(result.claim_id) if result.claim_id else None,
            "quarantine_id": str(result.quarantine_id) if result.quarantine_id else None,
            "quarantined": result.quarantined, "reasons": list(result.reasons)}


def build_server(engram_for: Callable[[], Engram], *, auth: AuthSettings | None = None,
                 token_verifier: BearerVerifier | None = None) -> EngramServer:
    """Every operation an agent or operator needs, each one call of the Python client (the
    service functions GraphQL calls) under the caller's identity."""
    server = EngramServer(
        name="engram", instructions="Engram memory: recall and prepare evidence, remember notes "
        "and decisions, write documents, record and resolve facts, give feedback, audit.",
        auth=auth, token_verifier=token_verifier)

    # -- who is asking ------------------------------------------------------------------

    @server.tool()
    @coded
    def whoami() -> dict[str, Any]:
        """Who this token says is asking, and the scopes of its tenant: the names to pass as
        scopes when writing (can_write) and what recall reads (can_read)."""
        engram = engram_for()
        ident = engram.identity
        return {"org_id": ident.org_id, "user_id": ident.user_id,
                "read_scopes": sorted(ident.readable), "write_scopes": sorted(ident.write_scopes),
                "roles": sorted(ident.roles),
                "scopes": [{"name": v.name, "description": v.description, "can_read": v.can_read,
                            "can_write": v.can_write} for v in engram.scopes()]}

    # -- recall ----------------------------------------------------------------------

    @server.tool()
    @coded
    def recall(question: Question, asker: Asker = None, budget_tokens: Budget = None,
               mode: Mode = None, session_id: RecallSession = None) -> dict[str, Any]:
        """Evidence for a question from everything this identity may read, within a token budget.
        mode (causal, timeline) adds weight to those lanes; session_id limits the session notes
        to the asker's current session."""
        result = engram_for().recall(question, asker=asker, budget_tokens=budget_tokens, mode=mode,
                                     session=session_id)
        return {"rendered": result.rendered, "used_tokens": result.used_tokens,
                "needed_tokens": result.needed_tokens, "receipt_id": id_text(result.receipt_id),
                "evidence": [_evidence(e) for e in result.evidence]}

    @server.tool()
    @coded
    def memory_prepare(question: Question, asker: Asker = None, budget_tokens: Budget = None,
                       session_id: RecallSession = None, mode: Mode = None) -> dict[str, Any]:
        """One prompt-ready bundle under one budget: current keyed facts about the entities in
        play, relevant evidence, lessons, recent episodes and top documents. rendered is the
        string to put before the question; each item carries item_table and item_id (a top
        document its document_id, table sources.documents) for mark_used."""
        bundle = engram_for().memory_prepare(question, asker=asker, budget_tokens=budget_tokens,
                                             mode=mode, session=session_id)
        return {"rendered": bundle.rendered, "used_tokens": bundle.used_tokens,
                "needed_tokens": bundle.needed_tokens, "receipt_id": id_text(bundle.receipt_id),
                **{part: [_evidence(e) for e in getattr(bundle, part)]
                   for part in ("keyed_facts", "evidence", "lessons", "episodes")},
                "documents": [{"title": d.title, "collection": d.collection, "path": d.path,
                               "item_table": "sources.documents", "item_id": str(d.document_id),
                               "scopes": [x.name for x in d.scopes]} for d in bundle.documents]}

    @server.tool()
    @coded
    def trace(question: Question, asker: Asker = None, budget_tokens: Budget = None,
              mode: Mode = None, session_id: RecallSession = None) -> str:
        """What `engram trace` prints: every stage of a recall (pools per lane, fusion, rerank,
        order, budget cut, side effects, timings), then the rendered string."""
        result, found = engram_for().trace(question, asker=asker, budget_tokens=budget_tokens,
                                           mode=mode, session=session_id)
        return report(found, result.rendered)

    # -- memory: notes, decisions, episodes ------------------------------------------

    @server.tool()
    @coded
    def remember(session_id: SessionId,
                 text: Annotated[str, _said("The note, in plain words (at most 20,000 "
                                            "characters).")],
                 scopes: WriteScopes,
                 ttl_seconds: Annotated[int, _said(
                     "How long recall may serve the note, in seconds (at most a year).")] = 86400
                 ) -> str:
        """Keep a recent session note; returns its id."""
        return str(engram_for().remember(session_id, text, scopes, ttl_seconds=ttl_seconds))

    @server.tool()
    @coded
    def session_notes(session_id: Annotated[str | None, _said(
                          "One session's notes (the id given to remember); omitted: every "
                          "session's.")] = None,
                      first: First = 100) -> list[str]:
        """The caller's unexpired session notes (of one session, or all), oldest first."""
        return engram_for().working_memory(session_id, first=first)

    @server.tool()
    @coded
    def record_decision(
            category: Annotated[str, _said("A short label grouping related decisions, e.g. "
                                           "'infra' or 'hiring' (at most 100 characters).")],
            scenario: Annotated[str, _said("The situation the decision was made in, or the "
                                           "question it answers.")],
            reasoning: Annotated[str, _said("Why this choice was made.")],
            confidence: Annotated[float, _said("How sure the decision was, from 0 to 1.")],
            scopes: WriteScopes,
            outcome: Annotated[str | None, _said(
                "What came of it, once known (a decision with an outcome is a lesson "
                "memory_prepare serves); omitted: not yet known.")] = None) -> str:
        """Record a decision with its reasoning; returns its id."""
        return str(engram_for().record_decision(category, scenario, reasoning, confidence, scopes,
                                                outcome=outcome))

    @server.tool()
    @coded
    def record_episode(session_id: SessionId,
                       summary: Annotated[str, _said("What happened in the session, in plain "
                                                     "words.")],
                       started_at: Moment, ended_at: Moment, scopes: WriteScopes,
                       turn_count: Annotated[int, _said("How many turns the session had "
                                                        "(0: not counted).")] = 0) -> str:
        """Record what happened in a session (ISO 8601 times with a time zone); returns its id."""
        start, end = timestamp("started_at", started_at), timestamp("ended_at", ended_at)
        assert start is not None and end is not None
        return str(engram_for().record_episode(session_id, summary, start, end, scopes,
                                               turn_count=turn_count))

    # -- documents and their lifecycle -------------------------------------------------

    @server.tool()
    @coded
    def search_documents(
            collection: Annotated[str | None, _said("Only this collection; omitted: all.")] = None,
            kind: Annotated[str | None, _said("Only documents of this kind (e.g. note); "
                                              "omitted: all.")] = None,
            state: Annotated[str | None, _said(f"Only documents in this state: "
                                               f"{_one_of(KNOWN_STATES)}; omitted: all.")] = None,
            first: First = 20, after: After = None,
            include_hidden: Annotated[bool, _said("Also archived and snoozed documents.")] = False
    ) -> dict[str, Any]:
        """Readable documents (no bodies), ordered by collection and path, with a next cursor;
        include_hidden adds archived and snoozed ones."""
        page = engram_for().documents(first=first, after=after, collection=collection, kind=kind,
                                      state=state, include_hidden=include_hidden)
        return {"documents": [_document(v) for _, v in page.items],
                "next": page.end_cursor if page.has_next_page else None}

    @server.tool()
    @coded
    def get_document(collection: Collection, path: DocPath) -> dict[str, Any] | None:
        """One readable document with its body and embedding progress, or null."""
        view = engram_for().document(collection, path)
        return None if view is None else _document(view, body=True)

    @server.tool()
    @coded
    def upsert_document(
            collection: Collection, path: DocPath,
            title: Annotated[str, _said("The document's title (recall ranks a question that "
                                        "names it first).")],
            body: Annotated[str, _said("The whole text, Markdown or plain.")],
            scopes: WriteScopes,
            kind: Annotated[str, _said("What the document is, e.g. note, project, area, "
                                       "meeting.")] = "note",
            state: Annotated[str | None, _said(f"Its state: {_one_of(KNOWN_STATES)}; omitted: "
                                               f"none.")] = None,
            area: Annotated[str | None, _said("The area (a standing responsibility) it belongs "
                                              "to; omitted: none.")] = None,
            metadata: Annotated[dict[str, Any] | None, _said(
                'Any JSON object kept with the document; {"extract": false} keeps it out of '
                'extraction.')] = None,
            occurred_at: OptionalMoment = None) -> dict[str, Any]:
        """Write the document at (collection, path), as `engram ingest` does: occurred_at (ISO
        8601 with a time zone) is when what it describes happened (the timeline lane);
        metadata {"extract": false} keeps it out of extraction. Unchanged content writes
        nothing; changed content is chunked and queued for embedding."""
        result, view = engram_for().upsert_document(
            collection, path, title, body, scopes=scopes, kind=kind, state=state, area=area,
            metadata=metadata, occurred_at=occurred_at)
        return {"document": _document(view), "created": result.created, "changed": result.changed,
                "chunks": result.chunks}

    @server.tool()
    @coded
    def delete_document(collection: Collection, path: DocPath) -> str:
        """Delete the document at (collection, path); returns its id."""
        return str(engram_for().delete_document(collection, path))

    @server.tool()
    @coded
    def pin(document_id: DocumentId,
            pinned: Annotated[bool, _said("true pins, false unpins.")] = True) -> dict[str, Any]:
        """Pin (or unpin) a document: recall boosts pinned items."""
        return _document(engram_for().pin(document_id, pinned))

    @server.tool()
    @coded
    def snooze(document_id: DocumentId,
               until: Annotated[str | None, _said(
                   "An ISO 8601 date and time with a time zone until which recall hides the "
                   "document; omitted: wake it now.")] = None) -> dict[str, Any]:
        """Hide a document from recall until a moment (ISO 8601 with a time zone); no until
        wakes it now."""
        return _document(engram_for().snooze(document_id, timestamp("until", until)))

    @server.tool()
    @coded
    def archive(document_id: DocumentId,
                archived: Annotated[bool, _said("true archives, false restores.")] = True
                ) -> dict[str, Any]:
        """Archive (or restore) a document: archived documents are hidden from recall."""
        return _document(engram_for().archive(document_id, archived))

    # -- entities, claims and keyed facts ---------------------------------------------

    @server.tool()
    @coded
    def entity(entity_type: EntityType, name: EntityName) -> str | None:
        """The id of the entity of this type named (or aliased) name, or null; never creates."""
        found = engram_for().entity(entity_type, name)
        return str(found) if found else None

    @server.tool()
    @coded
    def resolve_entity(entity_type: EntityType, name: EntityName, scopes: WriteScopes) -> str:
        """The id of the entity of this type named name, created (shared into scopes) if missing."""
        return str(engram_for().resolve_entity(entity_type, name, scopes))

    @server.tool()
    @coded
    def search_entities(
            query: Annotated[str | None, _said("Text found inside the name or an alias; "
                                               "omitted: every entity.")] = None,
            entity_type: Annotated[str | None, _said("Only entities of this type (e.g. "
                                                     "person); omitted: all.")] = None,
            first: First = 20, after: After = None,
            retracted: Annotated[bool, _said(
                "Also entities extraction made that nothing current names any longer (every "
                "claim about them retracted when the rules changed).")] = False) -> dict[str, Any]:
        """Readable canonical entities whose name or alias contains query, with a next cursor."""
        page = engram_for().entities(query=query, entity_type=entity_type, first=first, after=after,
                                     retracted=retracted)
        return {"entities": [plain(v) for _, v in page.items],
                "next": page.end_cursor if page.has_next_page else None}

    @server.tool()
    @coded
    def facts(entity_id: EntityId,
              include_beaten: Annotated[bool, _said(
                  "Also claims a newer keyed fact or a resolved conflict beat.")] = False,
              first: First = 100) -> list[Any]:
        """Current claims about an entity (keyed facts applied; beaten ones with include_beaten)."""
        return list(plain(engram_for().facts(entity_id, include_beaten=include_beaten,
                                             first=first)))

    @server.tool()
    @coded
    def assert_fact(
            subject_id: Annotated[str, _said("The entity the claim is about (an entity id).")],
            predicate: Annotated[str, _said("What is said of it, snake_case, e.g. lives_in, "
                                            "works_at, level.")],
            text: Annotated[str, _said("The claim as a sentence, e.g. 'Ann lives in Porto'.")],
            scopes: WriteScopes,
            value: Annotated[str | float | bool | None, _said(
                "The claim's literal value (text, number or boolean); or give object_id.")] = None,
            object_id: Annotated[str | None, _said(
                "The entity the claim points to (an entity id), instead of a value.")] = None,
            datatype: Annotated[str | None, _said(
                f"The value's type: {_one_of(DATATYPES)}; omitted: from the value.")] = None,
            kind: Annotated[str, _said(f"What sort of claim: {_one_of(EPISTEMIC_KINDS)}.")
                            ] = "world_fact",
            confidence: Annotated[float, _said("How sure, from 0 to 1.")] = 1.0,
            authority: Annotated[int, _said(
                "Rank of the claim's source when conflicts are resolved by authority (higher "
                "wins).")] = 0,
            valid_from: OptionalMoment = None, valid_to: OptionalMoment = None,
            fact_key: Annotated[str | None, _said(
                "A keyed fact's key (with as_of): the newest as_of per key is current, e.g. "
                "'ann.city'.")] = None,
            as_of: OptionalMoment = None) -> dict[str, Any]:
        """Assert a claim about an entity; it lands or is quarantined with the reasons. A keyed
        fact gives fact_key and as_of (ISO 8601 with a time zone): the newest as_of per key is
        current and outranks prose that contradicts it."""
        return _assert_result(engram_for().assert_fact(
            subject_id, predicate, text, scopes, value=value, object_id=object_id,
            datatype=datatype, kind=kind, confidence=confidence,  # type: ignore[arg-type]
            authority=authority, valid_from=valid_from, valid_to=valid_to, fact_key=fact_key,
            as_of=as_of))

    @server.tool()
    @coded
    def conflicts(status: Annotated[str | None, _said(
                      f"Only conflicts in this status: {_one_of(CONFLICT_STATUSES)}; omitted: "
                      f"all.")] = None,
                  first: First = 100) -> list[Any]:
        """Detected fact conflicts the caller can read (status open or resolved), oldest first."""
        return list(plain(engram_for().conflicts(status=status, first=first)))

    @server.tool()
    @coded
    def resolve_conflict(
            conflict_id: Annotated[str, _said("A conflict id, as conflicts returns it.")],
            strategy: Annotated[str, _said(f"How to resolve it: {_one_of(STRATEGIES)}.")],
            winner: Annotated[str | None, _said(
                "With strategy manual: the claim id that wins.")] = None) -> str | None:
        """Resolve a conflict: newest_wins, highest_authority_wins, keep_both, or manual with
        winner (a claim id); returns the winning claim (null for keep_both)."""
        won = engram_for().resolve_conflict(conflict_id, strategy, winner)  # type: ignore[arg-type]
        return str(won) if won else None

    @server.tool()
    @coded
    def quarantine(status: Annotated[str | None, _said(
                       f"Only held claims in this status: {_one_of(QUARANTINE_STATUSES)}; null: "
                       f"all.")] = "held",
                   first: First = 100) -> list[Any]:
        """Claims held back by a shape check, with the reasons, oldest first."""
        return list(plain(engram_for().quarantine(status=status, first=first)))

    @server.tool()
    @coded
    def release_quarantine(
            quarantine_id: Annotated[str, _said("A held claim's id, as quarantine returns it.")],
            corrections: Annotated[dict[str, Any] | None, _said(
                "Claim fields to change before the retry: object_value, object_id, "
                "object_datatype, predicate, subject_id, valid_from, valid_to, confidence, "
                "authority, epistemic_kind.")] = None) -> dict[str, Any]:
        """Retry a held claim with corrections (claim fields such as object_value, predicate,
        valid_from); it lands, or stays held with the new reasons."""
        return _assert_result(engram_for().release_quarantine(quarantine_id, corrections))

    # -- feedback -----------------------------------------------------------------------

    @server.tool()
    @coded
    def mark_used(
            items: Annotated[list[dict[str, str]] | None, _said(
                'Evidence that helped, as recall returned it: [{"table": item_table, "id": '
                'item_id}].')] = None,
            claim_ids: Annotated[list[str] | None, _said(
                "Facts that helped, by claim id (the short form).")] = None) -> int:
        """Feedback: these served items helped. items: [{"table": item_table, "id": item_id}] from
        recall's evidence; claim_ids: the short form for facts. Returns how many were recorded."""
        if items is not None and not all(isinstance(i, dict) for i in items):
            raise BadInput('items are objects {"table": item_table, "id": item_id}')
        return engram_for().mark_used([(str(i.get("table")), str(i.get("id"))) for i in items or []],
                                      claim_ids=claim_ids or [])

    # -- provenance (auditors: token scope engram:auditor) --------------------------------

    @server.tool()
    @coded
    def verify_receipt(
            receipt_id: Annotated[str, _said(
                "The receipt_id a recall or memory_prepare answered (a trace names it too).")],
            rendered: Annotated[str | None, _said(
                "The text the recall returned, to check it too; omitted: the evidence "
                "only.")] = None) -> dict[str, Any]:
        """Auditors only: re-derive a recall receipt of this tenant (a trace names it): proven
        (genuine) and ok (its evidence is still as served); rendered checks the text too."""
        return dict(plain(engram_for().verify_receipt(receipt_id, rendered=rendered)))

    @server.tool()
    @coded
    def lineage(
            table: Annotated[str, _said("The row's table, schema-qualified, e.g. "
                                        "sources.documents.")],
            row_id: Annotated[dict[str, Any], _said('The row\'s key, e.g. {"id": "..."}.')],
            direction: Annotated[str, _said("back (to its origins) or forward (to what was "
                                            "derived from it).")] = "back",
            max_depth: Annotated[int, _said("How many derivation steps to follow (1 to "
                                            "100).")] = 10
    ) -> dict[str, Any]:
        """Auditors only: the derivation lineage of a row (table such as "sources.documents",
        row_id its key, e.g. {"id": "..."}), back to its origins or forward."""
        return dict(plain(engram_for().provenance(table, row_id, direction=direction,  # type: ignore[arg-type]
                                                  max_depth=max_depth)))

    @server.tool()
    @coded
    def verify_chain(rows: Annotated[bool, _said(
                         "Also check each chained row against its latest chain event.")] = True
                     ) -> dict[str, Any]:
        """Auditors only: recompute this tenant's provenance hash chain (and each row's)."""
        return dict(plain(engram_for().verify_chain(rows=rows)))

    return server
