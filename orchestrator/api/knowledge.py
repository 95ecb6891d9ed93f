"""Resolvers for knowledge and memory: thin wrappers over ``orchestrator.ingest.knowledge``
and ``orchestrator.ingest.memory``, which own validation; the database owns the rules."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from ariadne import MutationType, QueryType

from orchestrator.api.documents import parse_id
from orchestrator.errors import BadInput
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest import memory as mem


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _out(row: Any) -> dict[str, Any]:
    return {_camel(k): (str(v) if isinstance(v, uuid.UUID) else v) for k, v in asdict(row).items()}


def _ids(values: list[str], what: str) -> list[uuid.UUID]:
    return [parse_id(v, what) for v in values]


def bind(query: QueryType, mutation: MutationType) -> None:
    @query.field("entity")
    def resolve_entity_id(_: None, info: Any, type: str, name: str) -> str | None:
        found = kn.resolve_entity(info.context.session, type, name, create=False)
        return str(found) if found else None

    @query.field("facts")
    def resolve_facts(_: None, info: Any, entityId: str,  # noqa: N803
                      includeBeaten: bool = False) -> list[dict[str, Any]]:  # noqa: N803
        facts = kn.current_facts(info.context.session, parse_id(entityId, "entity"),
                                 include_beaten=includeBeaten)
        return [_out(f) for f in facts]

    @query.field("conflicts")
    def resolve_conflicts(_: None, info: Any, status: str | None = None) -> list[dict[str, Any]]:
        return [_out(c) for c in kn.conflicts(info.context.session, status=status)]

    @query.field("quarantine")
    def resolve_quarantine(_: None, info: Any, status: str | None = "held") -> list[dict[str, Any]]:
        return [_out(q) for q in kn.quarantine(info.context.session, status=status)]

    @query.field("workingMemory")
    def resolve_working_memory(_: None, info: Any, sessionId: str | None = None  # noqa: N803
                               ) -> list[str]:
        return mem.working_memory(info.context.session, sessionId)

    @mutation.field("resolveEntity")
    def resolve_resolve_entity(_: None, info: Any, type: str, name: str,
                               scopes: list[str]) -> str:
        return str(kn.resolve_entity(info.context.session, type, name, scopes))

    @mutation.field("assertFact")
    def resolve_assert_fact(_: None, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        value = input.get("value")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise BadInput("value must be a string, number or boolean")
        object_id = input.get("objectId")
        fact = kn.FactInput(
            subject_id=parse_id(input["subjectId"], "subject"), predicate=input["predicate"],
            text=input["text"], scopes=tuple(input["scopes"]), value=value,
            object_id=parse_id(object_id, "object") if object_id else None,
            datatype=input.get("datatype"), kind=input.get("kind") or "world_fact",
            author_role=input.get("authorRole") or "user",
            confidence=input.get("confidence", 1.0), authority=input.get("authority", 0),
            valid_from=input.get("validFrom"), valid_to=input.get("validTo"),
            fact_key=input.get("factKey"), as_of=input.get("asOf"))
        result = kn.assert_fact(info.context.session, fact)
        return {"claimId": str(result.claim_id) if result.claim_id else None,
                "quarantineId": str(result.quarantine_id) if result.quarantine_id else None,
                "quarantined": result.quarantined, "reasons": list(result.reasons)}

    @mutation.field("resolveConflict")
    def resolve_resolve_conflict(_: None, info: Any, id: str, strategy: str,
                                 winner: str | None = None) -> dict[str, Any]:
        won = kn.resolve_conflict(info.context.session, parse_id(id, "conflict"), strategy,  # type: ignore[arg-type]
                                  parse_id(winner, "claim") if winner else None)
        return {"winner": str(won) if won else None}

    @mutation.field("remember")
    def resolve_remember(_: None, info: Any, sessionId: str, text: str,  # noqa: N803
                         scopes: list[str], ttlSeconds: int = 86400) -> str:  # noqa: N803
        if ttlSeconds <= 0:
            raise BadInput("ttlSeconds must be positive")
        return str(mem.add_working_memory(info.context.session, sessionId, text, scopes,
                                          ttl=timedelta(seconds=ttlSeconds)))

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

        used = [(i["table"], parse_id(i["id"], "item")) for i in items or []]
        used += [("knowledge.fact_claim", c) for c in _ids(claimIds or [], "claim")]
        if not used:
            raise BadInput("give the items (or claimIds) that were used")
        return mark_evidence_used(info.context.session, used, channel="graphql")
