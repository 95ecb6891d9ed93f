"""Resolvers for entities, knowledge and memory: thin wrappers over ``orchestrator.api.entities``,
``orchestrator.ingest.knowledge`` and ``orchestrator.ingest.memory``, which own validation (the
Python client calls the same functions); the database owns the rules."""

from __future__ import annotations

from typing import Any

from ariadne import MutationType, QueryType

from orchestrator.api import entities as ents
from orchestrator.api.documents import check_first, parse_id
from orchestrator.api.schema import as_graphql, connection
from orchestrator.errors import BadInput
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest import memory as mem


def fact_input(input: dict[str, Any]) -> kn.FactInput:
    """A GraphQL ``FactInput`` as the service's ``FactInput``."""
    value = input.get("value")
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise BadInput("value must be a string, number or boolean")
    object_id = input.get("objectId")
    return kn.FactInput(
        subject_id=parse_id(input["subjectId"], "subject"), predicate=input["predicate"],
        text=input["text"], scopes=tuple(input["scopes"]), value=value,
        object_id=parse_id(object_id, "object") if object_id else None,
        datatype=input.get("datatype"), kind=input.get("kind") or "world_fact",
        author_role=input.get("authorRole") or "user",
        confidence=input.get("confidence", 1.0), authority=input.get("authority", 0),
        valid_from=input.get("validFrom"), valid_to=input.get("validTo"),
        fact_key=input.get("factKey"), as_of=input.get("asOf"))


def assert_payload(result: kn.AssertResult) -> dict[str, Any]:
    return {"claimId": str(result.claim_id) if result.claim_id else None,
            "quarantineId": str(result.quarantine_id) if result.quarantine_id else None,
            "quarantined": result.quarantined, "reasons": list(result.reasons)}


def bind(query: QueryType, mutation: MutationType) -> None:
    @query.field("entity")
    def resolve_entity_id(_: None, info: Any, type: str, name: str) -> str | None:
        found = kn.resolve_entity(info.context.session, type, name, create=False)
        return str(found) if found else None

    @query.field("entities")
    def resolve_entities(_: None, info: Any, query: str | None = None, type: str | None = None,
                         first: int = 20, after: str | None = None,
                         retracted: bool = False) -> dict[str, Any]:
        ctx = info.context
        return connection(ents.list_entities(ctx.session, ctx.identity, ctx.settings, query=query,
                                             entity_type=type, first=first, after=after,
                                             retracted=retracted))

    @query.field("entityById")
    def resolve_entity_by_id(_: None, info: Any, id: str) -> Any:
        ctx = info.context
        return as_graphql(ents.entity_by_id(ctx.session, ctx.identity, parse_id(id, "entity")))

    @query.field("facts")
    def resolve_facts(_: None, info: Any, entityId: str,  # noqa: N803
                      includeBeaten: bool = False, first: int = 100) -> Any:  # noqa: N803
        ctx = info.context
        return as_graphql(kn.current_facts(
            ctx.session, parse_id(entityId, "entity"), include_beaten=includeBeaten,
            limit=check_first(first, ctx.settings.api_max_page_size)))

    @query.field("conflicts")
    def resolve_conflicts(_: None, info: Any, status: str | None = None, first: int = 100) -> Any:
        ctx = info.context
        return as_graphql(kn.conflicts(ctx.session, status=status,
                                       limit=check_first(first, ctx.settings.api_max_page_size)))

    @query.field("quarantine")
    def resolve_quarantine(_: None, info: Any, status: str | None = "held", first: int = 100) -> Any:
        ctx = info.context
        return as_graphql(kn.quarantine(ctx.session, status=status,
                                        limit=check_first(first, ctx.settings.api_max_page_size)))

    @query.field("workingMemory")
    def resolve_working_memory(_: None, info: Any, sessionId: str | None = None,  # noqa: N803
                               first: int = 100) -> list[str]:
        ctx = info.context
        return mem.working_memory(ctx.session, sessionId,
                                  limit=check_first(first, ctx.settings.api_max_page_size))

    @mutation.field("resolveEntity")
    def resolve_resolve_entity(_: None, info: Any, type: str, name: str,
                               scopes: list[str]) -> str:
        return str(kn.resolve_entity(info.context.session, type, name, scopes))

    @mutation.field("assertFact")
    def resolve_assert_fact(_: None, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        return assert_payload(kn.assert_fact(info.context.session, fact_input(input)))

    @mutation.field("releaseQuarantine")
    def resolve_release_quarantine(_: None, info: Any, id: str,
                                   corrections: Any = None) -> dict[str, Any]:
        return assert_payload(kn.release_quarantine(info.context.session,
                                                    parse_id(id, "quarantine"), corrections))

    @mutation.field("resolveConflict")
    def resolve_resolve_conflict(_: None, info: Any, id: str, strategy: str,
                                 winner: str | None = None) -> dict[str, Any]:
        won = kn.resolve_conflict(info.context.session, parse_id(id, "conflict"), strategy,  # type: ignore[arg-type]
                                  parse_id(winner, "claim") if winner else None)
        return {"winner": str(won) if won else None}

    @mutation.field("remember")
    def resolve_remember(_: None, info: Any, sessionId: str, text: str,  # noqa: N803
                         scopes: list[str], ttlSeconds: int = 86400) -> str:  # noqa: N803
        return str(mem.add_working_memory(info.context.session, sessionId, text, scopes,
                                          ttl=mem.ttl_seconds(ttlSeconds)))

    @mutation.field("recordDecision")
    def resolve_record_decision(_: None, info: Any, input: dict[str, Any]) -> str:
        decision = mem.DecisionInput(
            category=input["category"], scenario=input["scenario"], reasoning=input["reasoning"],
            confidence=input["confidence"], scopes=tuple(input["scopes"]),
            outcome=input.get("outcome"))
        return str(mem.record_decision(info.context.session, decision))

    @mutation.field("recordEpisode")
    def resolve_record_episode(_: None, info: Any, sessionId: str, summary: str,  # noqa: N803
                               startedAt: Any, endedAt: Any, scopes: list[str],  # noqa: N803
                               turnCount: int = 0) -> str:  # noqa: N803
        return str(mem.record_episode(info.context.session, sessionId, summary, startedAt, endedAt,
                                      scopes, turn_count=turnCount))

    @mutation.field("markUsed")
    def resolve_mark_used(_: None, info: Any, items: list[dict[str, str]] | None = None,
                          claimIds: list[str] | None = None) -> int:  # noqa: N803
        from orchestrator.derive.lifecycle import mark_evidence_used

        return mark_evidence_used(
            info.context.session, [(i["table"], parse_id(i["id"], "item")) for i in items or []],
            claim_ids=[parse_id(c, "claim") for c in claimIds or []], channel="graphql")
