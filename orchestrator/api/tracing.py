"""``recallTrace``: a recall and its trace as GraphQL values.

The trace (``orchestrator.recall.trace.Trace``) is built from the rows the recall's own
statement returned under the caller's identity, so it holds nothing the caller cannot read;
this module only reshapes it:

1. the steps the schema names (pools, fusion, hydration, precedence, reranker, order,
   duplicates, budget, timings) become typed fields;
2. every other field of ``Trace`` (a step a newer ranker adds: MMR, a learned ranker, PPR)
   becomes a generic ``TraceStep`` of name and JSON data, so it shows in every client,
   the console included, without a change here.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from datetime import date, datetime
from typing import Any

from orchestrator.errors import BadInput
from orchestrator.recall.plan import FULL_PLAN, PLAN_STUDY, PlanShape
from orchestrator.recall.tail import Candidate
from orchestrator.recall.trace import Trace, TraceItem, item

# Fields of Trace that have their own place in RecallTrace (or are the request itself).
NAMED = frozenset({
    "question", "asker", "plan", "mode", "budget_tokens", "session", "timings_ms", "corpus",
    "pools", "fused", "hydration_dropped", "reranker", "ordered", "suppressed", "kept",
    "used_tokens", "statements", "precedence", "side_effect_statements", "touched_claims",
    "receipt_id", "embedding_model"})


# Evaluation only (the candidates kept for Recaller.replay): never part of an answer.
UNSHOWN = frozenset({"replay"})


def _step(name: str, value: Any) -> Any:
    """A trace field the GraphQL type has no field for, as JSON; the learned ranker's report
    without its feature matrix (the usage row keeps that; a trace reader wants what it did)."""
    from orchestrator.recall.ranker import RankReport

    if isinstance(value, RankReport):
        return {"model": value.model, "note": value.note, "ppr": value.ppr,
                "timingsMs": json_value(value.timings_ms)}
    return json_value(value)


def plan_shape(name: str | None) -> PlanShape:
    if name is None or name == FULL_PLAN.name:
        return FULL_PLAN
    shape = PLAN_STUDY.get(name)
    if shape is None:
        raise BadInput(f"unknown plan shape {name!r}; use one of {', '.join(PLAN_STUDY)}")
    return shape


def plan_shapes() -> list[dict[str, Any]]:
    shapes = [FULL_PLAN, *(s for s in PLAN_STUDY.values() if s is not FULL_PLAN)]
    return [{"name": s.name, "lanes": list(s.lanes), "rerank": s.rerank} for s in shapes]


def trace_item(it: TraceItem) -> dict[str, Any]:
    return {"key": it.key, "kind": it.kind, "label": it.label, "direct": it.direct,
            "pinned": it.pinned, "lanes": json_value(it.lanes), "rrf": it.rrf,
            "rerank": it.rerank, "merit": it.merit, "section": it.section}


def json_value(value: Any) -> Any:
    """Any trace value as JSON: candidates as their trace items, dataclasses as objects."""
    if isinstance(value, Candidate):
        return json_value(item(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_value(v) for v in value]
    if isinstance(value, (uuid.UUID, datetime, date)):
        return str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "tolist") and getattr(value, "ndim", None):  # numpy arrays
        return json_value(value.tolist())
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return json_value(value.item())
    return str(value)


def _precedence(trace: Trace) -> list[dict[str, Any]]:
    p = trace.precedence
    out = [{"action": "dropped", "item": trace_item(item(c)),
            "reason": f"outranked by keyed fact {winner}"} for c, winner in p.beaten_claims]
    out += [{"action": "dropped", "item": trace_item(item(c)),
             "reason": f"confidence {c.confidence} below the observation gate"} for c in p.below_gate]
    out += [{"action": "demoted", "item": trace_item(item(c)),
             "reason": "contradicted by " + (item(w).label if w is not None
                                             else str(c.contradicted_by))}
            for c, w in p.contradicted]
    return out


def recall_trace(result: Any, trace: Trace, evidence: list[dict[str, Any]]) -> dict[str, Any]:
    """``result`` is the RecallResult of the run, ``evidence`` its items as GraphQL values."""
    corpus = trace.corpus
    return {
        "shape": trace.plan, "question": trace.question, "asker": trace.asker, "mode": trace.mode,
        "sessionId": trace.session, "budgetTokens": trace.budget_tokens,
        "usedTokens": result.used_tokens, "kept": trace.kept, "rendered": result.rendered,
        "neededTokens": trace.needed_tokens,
        "text": trace.format(),
        "evidence": evidence, "statements": trace.statements,
        "timings": [{"stage": k, "ms": v} for k, v in trace.timings_ms.items()],
        "corpusChunks": corpus.get("chunks"),
        "corpusAvgLength": (float(corpus["avg_length"]) if corpus.get("avg_length") is not None
                            else None),
        "seeds": list(corpus.get("seeds") or []),
        "pools": [{"lane": lane, "items": [trace_item(i) for i in items]}
                  for lane, items in trace.pools.items()],
        "fused": [trace_item(i) for i in trace.fused],
        "hydrationDropped": [{"label": d.label, "reason": d.reason, "lanes": json_value(d.lanes),
                              "rrf": d.rrf} for d in trace.hydration_dropped],
        "reranker": trace.reranker,
        "precedence": _precedence(trace),
        "ordered": [trace_item(i) for i in trace.ordered],
        "suppressed": [{"label": a, "twin": b, "similarity": s} for a, b, s in trace.suppressed],
        "touchedClaims": trace.touched_claims,
        "receiptId": str(trace.receipt_id) if trace.receipt_id else None,
        "embeddingModel": trace.embedding_model or None,
        "steps": _steps(trace),
    }


def _steps(trace: Trace) -> list[dict[str, Any]]:
    """Every trace field without a typed place, with its words (``Trace.said``): a step the
    trace has words for and that said nothing is idle."""
    said = trace.said()
    return [{"name": f.name, "data": _step(f.name, getattr(trace, f.name)),
             "text": said.get(f.name), "idle": f.name in said and said[f.name] is None}
            for f in dataclasses.fields(trace)
            if f.name not in NAMED | UNSHOWN and getattr(trace, f.name) is not None]
