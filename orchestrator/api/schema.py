"""The executable GraphQL schema: SDL from ``graphql/*.graphql`` bound to resolvers.

Resolvers are thin: they read the request's ``RequestContext`` (a verified
identity and the one ``bound_session`` of the request), convert arguments and
call ``orchestrator.api.documents``. Errors are Engram's hierarchy; the error
formatter puts each one's ``code`` in ``extensions.code`` and hides the text of
anything unexpected.

Limits are validation rules, so a refused query runs nothing: ``DepthLimit``
counts nested selections (introspection fields aside, which have their own
switch), Ariadne's cost validator multiplies list fields by their page size.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ariadne import MutationType, QueryType, ScalarType, load_schema_from_path, make_executable_schema
from ariadne.validation import cost_validator
from graphql.validation import ASTValidationRule
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from graphql import (
    FieldNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
)
from orchestrator.api import documents as ops
from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.errors import BadInput, EngramError, Forbidden
from orchestrator.ingest.documents import DocumentInput
from orchestrator.recall import Evidence, Recaller

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "graphql"
PRINTED_SCHEMA = SCHEMA_DIR / "schema.printed.graphql"
log = logging.getLogger("engram.api")


@dataclass
class RequestContext:
    identity: Identity
    session: Session
    settings: Settings
    recaller: Recaller | None = None
    auditor_engine: Callable[[], Engine] | None = None


def _ctx(info: Any) -> RequestContext:
    ctx: RequestContext = info.context
    return ctx


datetime_scalar = ScalarType("DateTime")
json_scalar = ScalarType("JSON")


@datetime_scalar.serializer
def _serialize_datetime(value: datetime) -> str:
    return value.isoformat()


@datetime_scalar.value_parser
def _parse_datetime(value: Any) -> datetime:
    if not isinstance(value, str):
        raise BadInput("a DateTime is an ISO 8601 string")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise BadInput(f"{value!r} is not an ISO 8601 date and time") from exc


query = QueryType()
mutation = MutationType()


def _document(view: ops.DocumentView) -> dict[str, Any]:
    return {
        "id": str(view.id), "collection": view.collection, "path": view.path, "title": view.title,
        "kind": view.kind, "state": view.state, "area": view.area, "body": view.body,
        "contentHash": view.content_hash, "author": view.author, "metadata": view.metadata,
        "pinned": view.pinned, "snoozedUntil": view.snoozed_until, "archivedAt": view.archived_at,
        "createdAt": view.created_at, "updatedAt": view.updated_at, "chunkCount": view.chunk_count,
        "scopes": [_scope(s) for s in view.scopes],
    }


def _scope(view: ops.ScopeView) -> dict[str, Any]:
    return {"name": view.name, "description": view.description, "canRead": view.can_read,
            "canWrite": view.can_write}


@query.field("me")
def resolve_me(_: None, info: Any) -> dict[str, Any]:
    ident = _ctx(info).identity
    return {"orgId": ident.org_id, "userId": ident.user_id, "readScopes": sorted(ident.readable),
            "writeScopes": sorted(ident.write_scopes), "roles": sorted(ident.roles)}


@query.field("scopes")
def resolve_scopes(_: None, info: Any) -> list[dict[str, Any]]:
    ctx = _ctx(info)
    return [_scope(s) for s in ops.list_scopes(ctx.session, ctx.identity)]


@query.field("documents")
def resolve_documents(_: None, info: Any, first: int = 20, after: str | None = None,
                      collection: str | None = None, kind: str | None = None,
                      state: str | None = None, includeHidden: bool = False  # noqa: N803
                      ) -> dict[str, Any]:
    ctx = _ctx(info)
    page = ops.list_documents(ctx.session, ctx.identity, ctx.settings, first=first, after=after,
                              collection=collection, kind=kind, state=state,
                              include_hidden=includeHidden)
    return {"edges": [{"cursor": c, "node": _document(v)} for c, v in page.items],
            "pageInfo": {"hasNextPage": page.has_next_page, "endCursor": page.end_cursor}}


@query.field("document")
def resolve_document(_: None, info: Any, collection: str, path: str) -> dict[str, Any] | None:
    ctx = _ctx(info)
    view = ops.get_document(ctx.session, ctx.identity, collection, path)
    return _document(view) if view else None


@query.field("documentById")
def resolve_document_by_id(_: None, info: Any, id: str) -> dict[str, Any] | None:
    ctx = _ctx(info)
    view = ops.get_document_by_id(ctx.session, ctx.identity, ops.parse_id(id))
    return _document(view) if view else None


def _evidence(ev: Evidence) -> dict[str, Any]:
    return {
        "text": ev.text, "provenance": str(ev.provenance),
        "scopes": [{"name": s.name, "description": s.description} for s in ev.scopes],
        "source": ({"collection": ev.source.collection, "path": ev.source.path,
                    "title": ev.source.title} if ev.source else None),
        "author": ev.author, "createdAt": ev.created_at, "updatedAt": ev.updated_at,
        "documentId": str(ev.document_id) if ev.document_id else None,
        "chunkId": str(ev.chunk_id) if ev.chunk_id else None,
        "charStart": ev.char_start, "charEnd": ev.char_end, "kind": ev.kind,
        "occurredAt": ev.occurred_at, "endedAt": ev.ended_at, "itemTable": ev.item_table,
        "itemId": str(ev.item_id) if ev.item_id else None,
        "fact": ({"subject": ev.fact.subject, "predicate": ev.fact.predicate,
                  "object": ev.fact.object, "epistemicKind": ev.fact.epistemic_kind,
                  "perspectiveKey": ev.fact.perspective_key, "authorRole": ev.fact.author_role,
                  "factKey": ev.fact.fact_key, "asOf": ev.fact.as_of} if ev.fact else None),
    }


def _recaller(info: Any) -> tuple[RequestContext, Recaller]:
    ctx = _ctx(info)
    if ctx.recaller is None:
        raise EngramError("recall is not configured on this server")
    # Recall binds the same identity in its own transaction.
    return ctx, ctx.recaller


@query.field("memoryPrepare")
def resolve_memory_prepare(_: None, info: Any, question: str, asker: str | None = None,
                           budgetTokens: int | None = None, mode: str | None = None  # noqa: N803
                           ) -> dict[str, Any]:
    ctx, recaller = _recaller(info)
    b = recaller.prepare(ctx.identity, question, asker, budgetTokens, mode)[0]
    return {"question": b.question, "asker": b.asker, "budgetTokens": b.budget_tokens,
            "usedTokens": b.used_tokens, "rendered": b.rendered,
            "keyedFacts": [_evidence(e) for e in b.keyed_facts],
            "evidence": [_evidence(e) for e in b.evidence],
            "lessons": [_evidence(e) for e in b.lessons],
            "episodes": [_evidence(e) for e in b.episodes],
            "documents": [{"id": str(d.document_id), "title": d.title, "collection": d.collection,
                           "path": d.path, "occurredAt": d.occurred_at, "updatedAt": d.updated_at}
                          for d in b.documents]}


@query.field("recall")
def resolve_recall(_: None, info: Any, question: str, asker: str | None = None,
                   budgetTokens: int | None = None, mode: str | None = None  # noqa: N803
                   ) -> dict[str, Any]:
    ctx, recaller = _recaller(info)
    result = recaller.recall(ctx.identity, question, asker, budgetTokens, mode)
    return {"question": result.question, "asker": result.asker,
            "budgetTokens": result.budget_tokens, "usedTokens": result.used_tokens,
            "rendered": result.rendered, "evidence": [_evidence(e) for e in result.evidence]}


def _auditor(ctx: RequestContext, what: str) -> tuple[Engine, Any]:
    """The auditor engine and the caller's tenant id, for auditor-only fields."""
    if "auditor" not in ctx.identity.roles:
        raise Forbidden(f"{what} is for auditors: the token needs the engram:auditor scope")
    if ctx.auditor_engine is None:
        raise EngramError("no auditor connection is configured on this server")
    return ctx.auditor_engine(), ctx.session.execute(select(func.auth.tenant_id())).scalar_one()


@query.field("provenance")
def resolve_provenance(_: None, info: Any, table: str, rowId: Any,  # noqa: N803
                       direction: str = "back", maxDepth: int = 10) -> dict[str, Any]:  # noqa: N803
    from orchestrator.audit.lineage import lineage

    if not isinstance(rowId, dict):
        raise BadInput('rowId is the row\'s key as a JSON object, e.g. {"id": "..."}')
    engine, tenant = _auditor(_ctx(info), "provenance")
    # Read as engram_auditor, always for the caller's own tenant: keys and hashes, no content.
    with engine.connect() as conn:
        found = lineage(conn, tenant, table, rowId, direction=direction,  # type: ignore[arg-type]
                        max_depth=maxDepth)
    return {
        "proven": found.proven(),
        "nodes": [{"table": n.table, "rowId": n.row_id, "eventSeqs": [e.seq for e in n.events]}
                  for n in found.nodes.values()],
        "edges": [{"relation": e.relation, "derivedTable": e.derived[0],
                   "derivedRowId": found.nodes[e.derived].row_id,
                   "sourceTable": e.source[0] if e.source else None,
                   "sourceRowId": found.nodes[e.source].row_id if e.source else None,
                   "sourceAgentId": str(e.source_agent_id) if e.source_agent_id else None,
                   "depth": e.depth, "eventSeq": e.event.seq if e.event else None}
                  for e in found.edges],
    }


@query.field("verifyChain")
def resolve_verify_chain(_: None, info: Any, rows: bool = True) -> dict[str, Any]:
    from orchestrator.audit import chain

    engine, tenant = _auditor(_ctx(info), "verifyChain")
    # The chain is read as engram_auditor, and only the caller's own tenant's.
    with engine.connect() as conn:
        reports = chain.verify(conn, tenant, rows=rows)
    if not reports:
        return {"ok": True, "checked": 0, "headSeq": None, "headHash": None, "brokenAt": None,
                "problem": None, "rowProblems": []}
    r = reports[0]
    return {"ok": r.ok, "checked": r.checked, "headSeq": r.head_seq,
            "headHash": r.head_hash.hex() if r.head_hash else None,
            "brokenAt": r.chain_break.seq if r.chain_break else None,
            "problem": r.chain_break.problem if r.chain_break else None,
            "rowProblems": [f"{p.table_name} {p.row_id}: {p.problem}" for p in r.row_problems]}


@mutation.field("upsertDocument")
def resolve_upsert(_: None, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    ctx = _ctx(info)
    metadata = input.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadInput("metadata must be a JSON object")
    doc = DocumentInput(
        collection=input["collection"], path=input["path"], title=input["title"],
        body=input["body"], scopes=tuple(input["scopes"]), kind=input.get("kind") or "note",
        state=input.get("state"), area=input.get("area"), metadata=metadata)
    result, view = ops.upsert_document(ctx.session, ctx.identity, doc, ctx.settings)
    return {"document": _document(view), "created": result.created, "changed": result.changed,
            "chunks": result.chunks}


@mutation.field("deleteDocument")
def resolve_delete(_: None, info: Any, collection: str, path: str) -> dict[str, Any]:
    return {"id": str(ops.remove_document(_ctx(info).session, collection, path))}


@mutation.field("pin")
def resolve_pin(_: None, info: Any, id: str, pinned: bool = True) -> dict[str, Any]:
    ctx = _ctx(info)
    return _document(ops.pin(ctx.session, ctx.identity, ops.parse_id(id), pinned))


@mutation.field("snooze")
def resolve_snooze(_: None, info: Any, id: str, until: datetime | None = None
                   ) -> dict[str, Any]:
    ctx = _ctx(info)
    return _document(ops.snooze(ctx.session, ctx.identity, ops.parse_id(id), until))


@mutation.field("archive")
def resolve_archive(_: None, info: Any, id: str, archived: bool = True
                    ) -> dict[str, Any]:
    ctx = _ctx(info)
    return _document(ops.archive(ctx.session, ctx.identity, ops.parse_id(id), archived))


@lru_cache(maxsize=1)
def build_schema() -> GraphQLSchema:
    from orchestrator.api import knowledge

    knowledge.bind(query, mutation)
    sdl = load_schema_from_path(str(SCHEMA_DIR / "schema.graphql"))
    return make_executable_schema(sdl, query, mutation, datetime_scalar, json_scalar)


def printed_schema() -> str:
    from graphql import print_schema

    return print_schema(build_schema()) + "\n"


def depth_limit(max_depth: int) -> type[ValidationRule]:
    class DepthLimit(ValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)

        def enter_operation_definition(self, node: OperationDefinitionNode, *_: Any) -> None:
            depth = self._depth(node.selection_set, 0, frozenset())
            if depth > max_depth:
                self.report_error(GraphQLError(
                    f"the query is {depth} levels deep; the limit is {max_depth}", node))

        def _depth(self, selections: SelectionSetNode | None, level: int,
                   seen: frozenset[str]) -> int:
            if selections is None:
                return level
            deepest = level
            for sel in selections.selections:
                if isinstance(sel, FieldNode):
                    if sel.name.value.startswith("__"):
                        continue
                    deepest = max(deepest, self._depth(sel.selection_set, level + 1, seen))
                elif isinstance(sel, InlineFragmentNode):
                    deepest = max(deepest, self._depth(sel.selection_set, level, seen))
                elif isinstance(sel, FragmentSpreadNode):
                    name = sel.name.value
                    fragment = self.context.get_fragment(name)
                    if fragment is not None and name not in seen:
                        deepest = max(deepest, self._depth(fragment.selection_set, level,
                                                           seen | {name}))
            return deepest

    return DepthLimit


COST_MAP: dict[str, dict[str, Any]] = {
    "Query": {"documents": {"complexity": 1, "multipliers": ["first"]},
              # One recall is a statement over every lane, an embedding and a rerank.
              "recall": {"complexity": 50}, "memoryPrepare": {"complexity": 50}},
}


def validation_rules(settings: Settings, variables: dict[str, Any] | None
                     ) -> list[type[ASTValidationRule]]:
    return [depth_limit(settings.api_max_depth),
            cost_validator(settings.api_max_cost, variables=variables, cost_map=COST_MAP)]


def format_error(error: GraphQLError, debug: bool = False) -> dict[str, Any]:
    formatted: dict[str, Any] = dict(error.formatted)
    original = error.original_error
    if isinstance(original, EngramError):
        formatted["message"] = original.message
        formatted["extensions"] = {"code": original.code}
    elif original is not None:
        # Never show an unexpected exception's text: it may carry SQL or data.
        error_id = uuid.uuid4().hex[:12]
        log.error("unexpected error %s in %s", error_id, error.path, exc_info=original)
        formatted["message"] = f"internal error (reference {error_id})"
        formatted["extensions"] = {"code": "INTERNAL"}
    else:
        # Parse and validation errors, the depth and cost limits among them.
        formatted.setdefault("extensions", {})["code"] = BadInput.code
    return formatted
