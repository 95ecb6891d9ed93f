"""Resolvers of ``graphql/console.graphql``: the fields the console is built on, thin wrappers
over ``tracing``, ``memory_views``, ``operations`` and ``audit``."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ariadne import MutationType, ObjectType, QueryType

from orchestrator.api import audit, memory_views, operations, tracing
from orchestrator.api.bundles import evidence_view
from orchestrator.api.documents import check_first, parse_id
from orchestrator.api.schema import RequestContext, _auditor, _recaller, as_graphql
from orchestrator.errors import NotFound


def _ctx(info: Any) -> RequestContext:
    ctx: RequestContext = info.context
    return ctx


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def bind(query: QueryType, mutation: MutationType) -> list[ObjectType]:
    """Bind the fields on ``query`` and ``mutation``; returns the extended object types."""
    document, conflict, quarantine_item = (ObjectType("Document"), ObjectType("Conflict"),
                                           ObjectType("QuarantineItem"))

    @query.field("recallTrace")
    def resolve_recall_trace(_: None, info: Any, question: str, asker: str | None = None,
                             budgetTokens: int | None = None, mode: str | None = None,  # noqa: N803
                             sessionId: str | None = None, shape: str = "full"  # noqa: N803
                             ) -> dict[str, Any]:
        ctx, recaller = _recaller(info)
        plan = tracing.plan_shape(shape)
        started = time.perf_counter()
        if plan.name == "full":
            result, trace = recaller.trace(ctx.identity, question, asker, budgetTokens, mode,
                                           sessionId, "graphql")
            operations.LATENCIES.record(ctx.identity.org_id,
                                        (time.perf_counter() - started) * 1000.0)
        else:
            result, trace = recaller.study(ctx.identity, question, plan, asker, budgetTokens,
                                           mode, sessionId)
        return tracing.recall_trace(result, trace, [evidence_view(e) for e in result.evidence])

    @query.field("planShapes")
    def resolve_plan_shapes(_: None, info: Any) -> list[dict[str, Any]]:
        return tracing.plan_shapes()

    @query.field("claim")
    def resolve_claim(_: None, info: Any, id: str) -> Any:
        found = memory_views.claim(_ctx(info).session, parse_id(id, "claim"))
        if found is None:
            raise NotFound(f"claim {id} does not exist in this tenant or is not visible")
        return as_graphql(found)

    @query.field("keyedFacts")
    def resolve_keyed_facts(_: None, info: Any, first: int = 100) -> Any:
        ctx = _ctx(info)
        return as_graphql(memory_views.keyed_facts(
            ctx.session, first=check_first(first, ctx.settings.api_max_page_size)))

    @query.field("derivedItems")
    def resolve_derived_items(_: None, info: Any, kind: str | None = None, first: int = 50) -> Any:
        ctx = _ctx(info)
        return as_graphql(memory_views.derived_items(
            ctx.session, kind=kind, first=check_first(first, ctx.settings.api_max_page_size)))

    @query.field("readableLineage")
    def resolve_readable_lineage(_: None, info: Any, table: str, id: str,
                                 direction: str = "back", maxDepth: int = 5) -> Any:  # noqa: N803
        return as_graphql(memory_views.readable_lineage(_ctx(info).session, table, id,
                                                        direction=direction, max_depth=maxDepth))

    @query.field("embedQueue")
    def resolve_embed_queue(_: None, info: Any, hours: int = 24, buckets: int = 24) -> Any:
        return as_graphql(operations.embed_queue(_ctx(info).session, hours=hours, buckets=buckets))

    @query.field("models")
    def resolve_models(_: None, info: Any) -> Any:
        ctx = _ctx(info)
        # The recaller's reranker, only if a recall already loaded it: asking never loads one.
        reranker = getattr(ctx.recaller, "_reranker", None) if ctx.recaller is not None else None
        embedder = getattr(ctx.recaller, "_embedder", None) if ctx.recaller is not None else None
        return as_graphql(operations.model_status(ctx.session, ctx.settings, reranker,
                                                  getattr(embedder, "device", None)))

    @query.field("recallLatency")
    def resolve_recall_latency(_: None, info: Any) -> dict[str, Any]:
        return operations.LATENCIES.histogram(_ctx(info).identity.org_id)

    @query.field("documentValue")
    def resolve_document_value(_: None, info: Any, days: int = 30, first: int = 20) -> Any:
        ctx = _ctx(info)
        return as_graphql(operations.document_value(
            ctx.session, days=days, first=check_first(first, ctx.settings.api_max_page_size)))

    @query.field("deriveRuns")
    def resolve_derive_runs(_: None, info: Any, first: int = 50) -> Any:
        ctx = _ctx(info)
        return as_graphql(operations.derive_runs(
            ctx.session, ctx.identity, first=check_first(first, ctx.settings.api_max_page_size)))

    @query.field("chainHead")
    def resolve_chain_head(_: None, info: Any) -> Any:
        engine, tenant = _auditor(_ctx(info), "chainHead")
        return as_graphql(audit.chain_head(engine, tenant))

    @query.field("verifyChainStep")
    def resolve_verify_chain_step(_: None, info: Any, fromSeq: int = 1, limit: int = 500,  # noqa: N803
                                  rows: bool = True) -> Any:
        engine, tenant = _auditor(_ctx(info), "verifyChainStep")
        return as_graphql(audit.verify_chain_step(engine, tenant, from_seq=fromSeq, limit=limit,
                                                  rows=rows))

    @query.field("checkAnchors")
    def resolve_check_anchors(_: None, info: Any, anchors: str) -> Any:
        engine, tenant = _auditor(_ctx(info), "checkAnchors")
        return as_graphql(audit.check_anchors(engine, tenant, anchors))

    @query.field("receipts")
    def resolve_receipts(_: None, info: Any, first: int = 20) -> Any:
        engine, tenant = _auditor(_ctx(info), "receipts")
        return as_graphql(audit.receipts(engine, tenant, first=first))

    @query.field("provenanceExport")
    def resolve_provenance_export(_: None, info: Any, format: str = "jsonld") -> str:
        engine, tenant = _auditor(_ctx(info), "provenanceExport")
        return audit.provenance_export(engine, tenant, format)

    @mutation.field("discardQuarantine")
    def resolve_discard_quarantine(_: None, info: Any, id: str) -> Any:
        return as_graphql(memory_views.discard_quarantine(_ctx(info).session,
                                                          parse_id(id, "quarantine")))

    def _claim_of(key: str) -> Any:
        def resolve(row: dict[str, Any], info: Any) -> Any:
            found = memory_views.claim(_ctx(info).session, _uuid(row[key]))
            return as_graphql(found) if found is not None else None
        return resolve

    conflict.set_field("a", _claim_of("claimA"))
    conflict.set_field("b", _claim_of("claimB"))

    @conflict.field("detectedAt")
    def resolve_detected_at(row: dict[str, Any], info: Any) -> Any:
        return memory_views.conflict_detected_at(_ctx(info).session, _uuid(row["id"]))

    @quarantine_item.field("createdAt")
    def resolve_quarantine_created(row: dict[str, Any], info: Any) -> Any:
        return memory_views.quarantine_extra(_ctx(info).session, _uuid(row["id"]))[0]

    @quarantine_item.field("author")
    def resolve_quarantine_author(row: dict[str, Any], info: Any) -> Any:
        return memory_views.quarantine_extra(_ctx(info).session, _uuid(row["id"]))[1]

    return [document, conflict, quarantine_item]


# Costs of these fields for the cost limit (see FIELD_COSTS in orchestrator/api/schema.py).
PAGED = {"complexity": 1, "multipliers": ["first"]}
COSTS: dict[str, dict[str, Any]] = {
    # A recall, as `recall` costs.
    "recallTrace": {"complexity": 100},
    "keyedFacts": PAGED, "derivedItems": PAGED, "documentValue": PAGED, "deriveRuns": PAGED,
    "receipts": PAGED,
    # One statement per step, over rows visible to the caller.
    "readableLineage": {"complexity": 10, "multipliers": ["maxDepth"]},
    # One scan per embeddable table and a depth query per point.
    "embedQueue": {"complexity": 50},
    # A receipt's evidence rows each get a version probe.
    "checkAnchors": {"complexity": 20},
    # Recomputes up to `limit` event hashes (and the rows at the head); exports the whole log.
    "verifyChainStep": {"complexity": 200}, "provenanceExport": {"complexity": 1000},
}
