"""The executable GraphQL schema: SDL from ``graphql/*.graphql`` bound to resolvers.

Resolvers are thin: they read the request's ``RequestContext`` (a verified
identity and the one ``bound_session`` of the request), convert arguments and
call ``orchestrator.api.documents``. Errors are Engram's hierarchy; the error
formatter puts each one's ``code`` in ``extensions.code`` and hides the text of
anything unexpected.

Limits are validation rules, so a refused query runs nothing: ``DepthLimit``
counts nested selections (introspection fields aside, which have their own
switch); the cost limit gives every field a cost (``cost_map``: heavy
resolvers and mutations priced high, lists multiplied by their page size).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ariadne import MutationType, QueryType, ScalarType, load_schema_from_path, make_executable_schema
from graphql.validation import ASTValidationRule
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
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
from orchestrator.api import audit, limits
from orchestrator.api import documents as ops
from orchestrator.api.bundles import bundle_view, recall_view
from orchestrator.api.operations import LATENCIES
from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.session import translate
from orchestrator.errors import BadInput, EngramError, internal_message, is_public
from orchestrator.ingest.documents import DocumentInput
from orchestrator.recall import Recaller

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "graphql"
PRINTED_SCHEMA = SCHEMA_DIR / "schema.printed.graphql"
# The SDL files, in order: the core schema, then the console's fields (extend type ...).
SDL_FILES = ("schema.graphql", "console.graphql")



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


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def as_graphql(value: Any) -> Any:
    """A service dataclass as GraphQL field values: camelCase keys, ids as strings. Dicts
    (JSON values such as metadata and row ids) pass through untouched."""
    if is_dataclass(value) and not isinstance(value, type):
        return {_camel(f.name): as_graphql(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [as_graphql(v) for v in value]
    return value


def connection(page: ops.Page[Any]) -> dict[str, Any]:
    return {"edges": [{"cursor": c, "node": as_graphql(v)} for c, v in page.items],
            "pageInfo": {"hasNextPage": page.has_next_page,
                         "hasPreviousPage": page.has_previous_page,
                         "startCursor": page.start_cursor, "endCursor": page.end_cursor}}


@query.field("me")
def resolve_me(_: None, info: Any) -> dict[str, Any]:
    ident = _ctx(info).identity
    return {"orgId": ident.org_id, "userId": ident.user_id, "readScopes": sorted(ident.readable),
            "writeScopes": sorted(ident.write_scopes), "roles": sorted(ident.roles)}


@query.field("scopes")
def resolve_scopes(_: None, info: Any) -> Any:
    ctx = _ctx(info)
    return as_graphql(ops.list_scopes(ctx.session, ctx.identity))


@query.field("documents")
def resolve_documents(_: None, info: Any, first: int = 20, after: str | None = None,
                      collection: str | None = None, kind: str | None = None,
                      state: str | None = None, includeHidden: bool = False  # noqa: N803
                      ) -> dict[str, Any]:
    ctx = _ctx(info)
    return connection(ops.list_documents(ctx.session, ctx.identity, ctx.settings, first=first,
                                         after=after, collection=collection, kind=kind, state=state,
                                         include_hidden=includeHidden))


@query.field("document")
def resolve_document(_: None, info: Any, collection: str, path: str) -> Any:
    ctx = _ctx(info)
    return as_graphql(ops.get_document(ctx.session, ctx.identity, collection, path))


@query.field("documentById")
def resolve_document_by_id(_: None, info: Any, id: str) -> Any:
    ctx = _ctx(info)
    return as_graphql(ops.document_by_id(ctx.session, ctx.identity, ops.parse_id(id)))


def _recaller(info: Any) -> tuple[RequestContext, Recaller]:
    ctx = _ctx(info)
    if ctx.recaller is None:
        raise EngramError("recall is not configured on this server")
    # Recall binds the same identity in its own transaction.
    return ctx, ctx.recaller


@query.field("memoryPrepare")
def resolve_memory_prepare(_: None, info: Any, question: str, asker: str | None = None,
                           budgetTokens: int | None = None, mode: str | None = None,  # noqa: N803
                           sessionId: str | None = None  # noqa: N803
                           ) -> dict[str, Any]:
    ctx, recaller = _recaller(info)
    started = time.perf_counter()
    bundle, trace = recaller.prepare(ctx.identity, question, asker, budgetTokens, mode, sessionId,
                                     "graphql")
    LATENCIES.record(ctx.identity.org_id, (time.perf_counter() - started) * 1000.0)
    return bundle_view(bundle, trace.embedding_model)


@query.field("recall")
def resolve_recall(_: None, info: Any, question: str, asker: str | None = None,
                   budgetTokens: int | None = None, mode: str | None = None,  # noqa: N803
                   sessionId: str | None = None  # noqa: N803
                   ) -> dict[str, Any]:
    ctx, recaller = _recaller(info)
    started = time.perf_counter()
    result, trace = recaller.trace(ctx.identity, question, asker, budgetTokens, mode, sessionId,
                                   "graphql", detail=False)
    LATENCIES.record(ctx.identity.org_id, (time.perf_counter() - started) * 1000.0)
    return recall_view(result, trace.embedding_model)


def _auditor(ctx: RequestContext, what: str) -> tuple[Engine, uuid.UUID]:
    """The auditor engine and the caller's tenant id, for auditor-only fields."""
    tenant = audit.auditor_tenant(ctx.session, ctx.identity, what)
    if ctx.auditor_engine is None:
        raise EngramError("no auditor connection is configured on this server")
    return ctx.auditor_engine(), tenant


@query.field("provenance")
def resolve_provenance(_: None, info: Any, table: str, rowId: Any,  # noqa: N803
                       direction: str = "back", maxDepth: int = 10) -> Any:  # noqa: N803
    engine, tenant = _auditor(_ctx(info), "provenance")
    return as_graphql(audit.provenance(engine, tenant, table, rowId,
                                       direction=direction, max_depth=maxDepth))  # type: ignore[arg-type]


@query.field("verifyReceipt")
def resolve_verify_receipt(_: None, info: Any, id: str, rendered: str | None = None) -> Any:
    engine, tenant = _auditor(_ctx(info), "verifyReceipt")
    return as_graphql(audit.verify_receipt(engine, tenant, ops.parse_id(id, "receipt"),
                                           rendered=rendered))


@query.field("verifyChain")
def resolve_verify_chain(_: None, info: Any, rows: bool = True) -> Any:
    engine, tenant = _auditor(_ctx(info), "verifyChain")
    return as_graphql(audit.verify_chain(engine, tenant, rows=rows))


@mutation.field("upsertDocument")
def resolve_upsert(_: None, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    ctx = _ctx(info)
    doc = DocumentInput(
        collection=input["collection"], path=input["path"], title=input["title"],
        body=input["body"], scopes=tuple(input["scopes"]), kind=input.get("kind") or "note",
        state=input.get("state"), area=input.get("area"), metadata=input.get("metadata"),
        occurred_at=input.get("occurredAt"))
    result, view = ops.upsert_document(ctx.session, ctx.identity, doc, ctx.settings)
    return {"document": as_graphql(view), "created": result.created, "changed": result.changed,
            "chunks": result.chunks}


@mutation.field("deleteDocument")
def resolve_delete(_: None, info: Any, collection: str, path: str) -> dict[str, Any]:
    return {"id": str(ops.remove_document(_ctx(info).session, collection, path))}


@mutation.field("pin")
def resolve_pin(_: None, info: Any, id: str, pinned: bool = True) -> Any:
    ctx = _ctx(info)
    return as_graphql(ops.pin(ctx.session, ctx.identity, ops.parse_id(id), pinned))


@mutation.field("snooze")
def resolve_snooze(_: None, info: Any, id: str, until: datetime | None = None) -> Any:
    ctx = _ctx(info)
    return as_graphql(ops.snooze(ctx.session, ctx.identity, ops.parse_id(id), until))


@mutation.field("archive")
def resolve_archive(_: None, info: Any, id: str, archived: bool = True) -> Any:
    ctx = _ctx(info)
    return as_graphql(ops.archive(ctx.session, ctx.identity, ops.parse_id(id), archived))


@lru_cache(maxsize=1)
def build_schema() -> GraphQLSchema:
    from orchestrator.api import console_fields, knowledge

    knowledge.bind(query, mutation)
    extended = console_fields.bind(query, mutation)
    # Not the whole folder: schema.printed.graphql there is the generated snapshot.
    sdl = "\n".join(load_schema_from_path(str(SCHEMA_DIR / name)) for name in SDL_FILES)
    return make_executable_schema(sdl, query, mutation, *extended, datetime_scalar, json_scalar)


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


# What one call of a field costs, relative to reading one value (every field not named here
# costs 1, every mutation MUTATION_COST). A multiplier scales the field and everything
# selected under it: page sizes, the depth of a lineage walk, the items of a list argument.
# The default limit (ENGRAM_API_MAX_COST 5000) then admits a full page of 100 documents,
# under 50 recalls, 4 chain verifications or 200 small writes in one request, and refuses
# floods of aliased heavy fields.
PAGED = {"complexity": 1, "multipliers": ["first"]}
FIELD_COSTS: dict[str, dict[str, dict[str, Any]]] = {
    "Query": {
        "documents": PAGED, "entities": PAGED, "facts": PAGED, "conflicts": PAGED,
        "quarantine": PAGED, "workingMemory": PAGED,
        # A statement over every lane, a query embedding and a cross-encoder pass.
        "recall": {"complexity": 100}, "memoryPrepare": {"complexity": 100},
        # A recursive walk plus one chain probe per node, per level.
        "provenance": {"complexity": 20, "multipliers": ["maxDepth"]},
        # Recomputes every event hash of the tenant (and every row's, by default).
        "verifyChain": {"complexity": 1000},
        # A seal and one chain probe per served row.
        "verifyReceipt": {"complexity": 50},
    },
    "Mutation": {
        # Chunking, lexical vectors, queued embeddings and chain events per chunk.
        "upsertDocument": {"complexity": 100},
        "markUsed": {"complexity": 5, "multipliers": ["items", "claimIds"]},
    },
}
MUTATION_COST = 25


@lru_cache(maxsize=1)
def cost_map() -> dict[str, dict[str, Any]]:
    """A cost for every field of every object type of the schema (introspection aside)."""
    from graphql import GraphQLObjectType
    from orchestrator.api.console_fields import COSTS

    schema = build_schema()
    given_costs = {**FIELD_COSTS, "Query": {**FIELD_COSTS["Query"], **COSTS}}
    costs: dict[str, dict[str, Any]] = {}
    for name, type_ in schema.type_map.items():
        if name.startswith("__") or not isinstance(type_, GraphQLObjectType):
            continue
        default = {"complexity": MUTATION_COST if type_ is schema.mutation_type else 1}
        given = given_costs.get(name, {})
        costs[name] = {f: given.get(f, default) for f in type_.fields}
    return costs


def cost_limit(max_cost: int, variables: dict[str, Any] | None) -> type[ASTValidationRule]:
    return limits.cost_rule(cost_map(), max_cost, variables)


def validation_rules(settings: Settings, variables: dict[str, Any] | None
                     ) -> list[type[ASTValidationRule]]:
    return [depth_limit(settings.api_max_depth), cost_limit(settings.api_max_cost, variables),
            limits.LiteralInputs]


def format_error(error: GraphQLError, debug: bool = False) -> dict[str, Any]:
    formatted: dict[str, Any] = dict(error.formatted)
    original: BaseException | None = error.original_error
    if isinstance(original, GraphQLError):
        # A variable refused while it was coerced (a scalar's parser raised): the wrapping
        # message names the variable; it is the caller's error when the parser's is ours.
        inner = original.original_error
        if isinstance(inner, EngramError) and is_public(inner):
            formatted["extensions"] = {"code": inner.code}
            return formatted
    if isinstance(original, DBAPIError):
        # A refusal the database worded for the caller keeps its code; anything else stays hidden.
        mapped = translate(original)
        if mapped.code != EngramError.code:
            original = mapped
    if isinstance(original, GraphQLError):
        # graphql-core's own refusal wrapped once more (a variable that does not coerce names
        # itself and the cause in the outer message): bad input, worded for the caller.
        original = None
    if isinstance(original, EngramError) and is_public(original):
        formatted["message"] = original.message
        formatted["extensions"] = {"code": original.code}
    elif original is not None:
        # Never show an unexpected exception's text: it may carry SQL or data.
        formatted["message"] = internal_message(original, error.path)
        formatted["extensions"] = {"code": "INTERNAL"}
    else:
        # Parse and validation errors, the depth and cost limits among them.
        formatted.setdefault("extensions", {})["code"] = BadInput.code
    return formatted
