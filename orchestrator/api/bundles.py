"""What a recall and a ``memory_prepare`` bundle look like on the wire: one shape for
GraphQL (``RecallResult``, ``MemoryBundle``) and REST (``POST /api/v1/memory/prepare``).

camelCase keys, ids as strings, datetimes as ``datetime`` (each transport writes them
as ISO 8601: GraphQL's scalar, REST's JSON encoder), ``embeddingModel`` naming the
model and activation the question was embedded with, ``receiptId`` the receipt sealed for
what was served (null when nothing was).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from orchestrator.recall import Evidence, RecallResult
from orchestrator.recall.prepare import PreparedMemory


def id_text(value: uuid.UUID | None) -> str | None:
    """An id as the transports write it (text), or None."""
    return None if value is None else str(value)


def evidence_view(ev: Evidence) -> dict[str, Any]:
    return {
        "text": ev.text, "provenance": str(ev.provenance),
        "scopes": [{"name": s.name, "description": s.description} for s in ev.scopes],
        "source": ({"collection": ev.source.collection, "path": ev.source.path,
                    "title": ev.source.title, "section": ev.source.section_titles}
                   if ev.source else None),
        "author": ev.author, "createdAt": ev.created_at, "updatedAt": ev.updated_at,
        "documentId": id_text(ev.document_id),
        "chunkId": id_text(ev.chunk_id),
        "charStart": ev.char_start, "charEnd": ev.char_end, "kind": ev.kind,
        "occurredAt": ev.occurred_at, "endedAt": ev.ended_at, "itemTable": ev.item_table,
        "itemId": id_text(ev.item_id), "clipped": ev.clipped,
        "fact": ({"subject": ev.fact.subject, "predicate": ev.fact.predicate,
                  "object": ev.fact.object, "epistemicKind": ev.fact.epistemic_kind,
                  "perspectiveKey": ev.fact.perspective_key, "authorRole": ev.fact.author_role,
                  "factKey": ev.fact.fact_key, "asOf": ev.fact.as_of} if ev.fact else None),
    }


def recall_view(result: RecallResult, embedding_model: str) -> dict[str, Any]:
    return {"question": result.question, "asker": result.asker,
            "budgetTokens": result.budget_tokens, "usedTokens": result.used_tokens,
            "rendered": result.rendered, "neededTokens": result.needed_tokens,
            "evidence": [evidence_view(e) for e in result.evidence],
            "embeddingModel": embedding_model, "receiptId": id_text(result.receipt_id)}


def bundle_view(b: PreparedMemory, embedding_model: str) -> dict[str, Any]:
    return {"question": b.question, "asker": b.asker, "budgetTokens": b.budget_tokens,
            "usedTokens": b.used_tokens, "rendered": b.rendered, "neededTokens": b.needed_tokens,
            "embeddingModel": embedding_model, "receiptId": id_text(b.receipt_id),
            "keyedFacts": [evidence_view(e) for e in b.keyed_facts],
            "evidence": [evidence_view(e) for e in b.evidence],
            "lessons": [evidence_view(e) for e in b.lessons],
            "episodes": [evidence_view(e) for e in b.episodes],
            "documents": [{"id": str(d.document_id), "title": d.title, "collection": d.collection,
                           "path": d.path, "occurredAt": d.occurred_at, "updatedAt": d.updated_at}
                          for d in b.documents]}


def jsonable(value: Any) -> Any:
    """A view with its datetimes as ISO 8601 text (for JSON transports)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value
